//! A worker's transitions of a run: claim, heartbeat, park, release and
//! the ends; and the sweeper's.

use crate::approval::{Approval, ApprovalRequest, ApprovalStatus, Resolver, RuleDecision};
use crate::event::EventData;
use crate::ids::ApprovalId;
use crate::run::{
    ClaimOutcome, ClaimRefused, DecideOutcome, ExecutionPolicy, Lease, Run, SweepAction, TransitionError,
    approval_expired_message, attempts_exhausted_message, event_limit_message, time_limit_message, warning_time,
};
use crate::run_values::RunStatus;
use crate::time::Timestamp;

impl Run {
    /// A worker takes the run: `queued`, or `running` with an expired lease.
    pub fn claim(
        &mut self,
        worker: &str,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<ClaimOutcome, ClaimRefused> {
        match self.status {
            RunStatus::Queued => {}
            RunStatus::Running => {
                let held = self.lease.as_ref().is_some_and(|lease| lease.expires_at > now);
                if held {
                    return Err(ClaimRefused::LeaseHeld);
                }
            }
            RunStatus::AwaitingApproval => return Err(ClaimRefused::AwaitingApproval),
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Canceled => {
                return Err(ClaimRefused::Terminal);
            }
        }
        if let (Some(since), Some(lease)) = (self.running_since.take(), &self.lease) {
            // A taken-over run: count the dead worker's time up to its last heartbeat.
            let last_heartbeat = Timestamp::from_millis(lease.expires_at.millis() - policy.lease.as_millis() as i64);
            self.execution_ms += last_heartbeat.since(since).as_millis() as u64;
        }
        if self.attempts >= policy.max_attempts {
            self.error = Some(attempts_exhausted_message(policy.max_attempts));
            self.complete(RunStatus::Failed, now);
            return Ok(ClaimOutcome::AttemptsExhausted);
        }
        if self.execution_time(now) >= policy.max_run_time {
            self.error = Some(time_limit_message(policy.max_run_time));
            self.complete(RunStatus::Failed, now);
            return Ok(ClaimOutcome::AttemptsExhausted);
        }
        // Room for this claim's event and the run's last one.
        if self.events_logged() + 2 > policy.max_events {
            self.error = Some(event_limit_message(policy.max_events));
            self.complete(RunStatus::Failed, now);
            return Ok(ClaimOutcome::AttemptsExhausted);
        }
        self.attempts += 1;
        self.resends = 0;
        self.status = RunStatus::Running;
        self.started_at.get_or_insert(now.max(self.created_at));
        self.running_since = Some(now);
        self.renew_lease(worker, now, policy);
        self.record(now, EventData::RunStarted { attempt: self.attempts });
        Ok(ClaimOutcome::Claimed)
    }

    fn renew_lease(&mut self, worker: &str, now: Timestamp, policy: &ExecutionPolicy) {
        let expires_at = now.plus(policy.lease);
        self.lease = Some(Lease { worker: worker.to_owned(), expires_at });
        self.due_at = Some(expires_at);
    }

    /// Whether `worker` may still write to this run as its executor.
    pub fn held_by(&self, worker: &str) -> bool {
        self.status == RunStatus::Running && self.lease.as_ref().is_some_and(|lease| lease.worker == worker)
    }

    fn ensure_held_by(&self, worker: &str) -> Result<(), TransitionError> {
        if self.held_by(worker) { Ok(()) } else { Err(TransitionError::LeaseLost) }
    }

    /// Extends the lease and saves the agent's progress.
    pub fn heartbeat(
        &mut self,
        worker: &str,
        checkpoint: Option<serde_json::Value>,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        self.renew_lease(worker, now, policy);
        if let Some(checkpoint) = checkpoint {
            self.save_checkpoint(checkpoint);
        }
        Ok(())
    }

    /// The agent asked for approvals: store them with its checkpoint and
    /// wait for the ones a person decides (those a rule decided are
    /// recorded resolved).
    pub fn park(
        &mut self,
        worker: &str,
        requests: Vec<(ApprovalId, ApprovalRequest)>,
        checkpoint: serde_json::Value,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        if requests.iter().all(|(_, request)| request.decided.is_some()) {
            // Nothing a person could decide: the run would wait for ever.
            return Err(TransitionError::InvalidState(self.status));
        }
        let approval_ids = self.add_approvals(requests, now, policy);
        self.stop_clock(now);
        self.status = RunStatus::AwaitingApproval;
        self.lease = None;
        self.record(now, EventData::RunAwaitingApproval { approval_ids });
        // The sweeper looks again when the first pending approval is to be
        // warned about or expires.
        self.due_at = self.next_approval_due(policy);
        // The stretch of work up to here finished normally.
        self.attempts = 0;
        self.save_checkpoint(checkpoint);
        Ok(())
    }

    /// Every call the agent asked about was decided by a rule: the
    /// approvals are recorded resolved, and the run goes on from
    /// `checkpoint`.
    pub fn record_rule_decisions(
        &mut self,
        worker: &str,
        requests: Vec<(ApprovalId, ApprovalRequest)>,
        checkpoint: serde_json::Value,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        if requests.iter().any(|(_, request)| request.decided.is_none()) {
            return Err(TransitionError::InvalidState(self.status));
        }
        self.add_approvals(requests, now, policy);
        self.renew_lease(worker, now, policy);
        self.save_checkpoint(checkpoint);
        Ok(())
    }

    /// Adds the approvals asked for, with their events; those a rule
    /// decided are resolved at once, by the rule. The ids of those left
    /// pending.
    fn add_approvals(
        &mut self,
        requests: Vec<(ApprovalId, ApprovalRequest)>,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Vec<ApprovalId> {
        let requested_at = now.max(self.created_at);
        let expires_at = requested_at.plus(policy.approval_timeout);
        let mut pending = Vec::with_capacity(requests.len());
        for (id, request) in requests {
            if self.approvals.iter().any(|approval| approval.id == id) {
                // The write was tried again after one that landed.
                continue;
            }
            let veto_window = request.veto_window();
            let mut approval = Approval {
                id,
                action: request.action,
                call: request.call,
                status: ApprovalStatus::Pending,
                requested_at,
                resolved_at: None,
                comment: None,
                // A rule's decision is made as it is asked: nothing to expire.
                expires_at: request.decided.is_none().then_some(expires_at),
                auto_approves_at: None,
                expiry_warned: false,
                resolved_by: None,
                edited_arguments: None,
                policy: request.policy,
                input_schema: request.input_schema,
                answer: None,
                tool_changed: request.tool_changed,
            };
            // A veto window: never expiring before it ends.
            if let Some(window) = veto_window {
                let auto_approves_at = requested_at.plus(window);
                approval.auto_approves_at = Some(auto_approves_at);
                approval.expires_at = approval.expires_at.map(|at| at.max(auto_approves_at));
            }
            self.record(now, EventData::ApprovalRequested(approval.clone()));
            let rule = approval.policy.as_ref().map(|policy| policy.rule.clone());
            match (request.decided, rule) {
                (Some(decided), Some(rule)) => {
                    (approval.status, approval.comment) = match decided {
                        RuleDecision::Allowed => (ApprovalStatus::Approved, None),
                        RuleDecision::Denied { reason } => (ApprovalStatus::Rejected, reason),
                    };
                    approval.resolved_at = Some(requested_at);
                    approval.resolved_by = Some(Resolver::Policy(rule));
                    self.record(now, EventData::ApprovalDecided(approval.clone()));
                }
                _ => pending.push(id),
            }
            self.approvals.push(approval);
        }
        pending
    }

    /// A worker that stops (shutdown) hands the run back without using up an attempt.
    pub fn release(
        &mut self,
        worker: &str,
        checkpoint: Option<serde_json::Value>,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        self.attempts = self.attempts.saturating_sub(1);
        if let Some(checkpoint) = checkpoint {
            self.save_checkpoint(checkpoint);
        }
        self.requeue(now, policy);
        self.record(now, EventData::RunRequeued);
        Ok(())
    }

    /// The run ends with `output`; `transcript`, when the agent gives one,
    /// is the state it ended with (kept for a run continuing this one).
    pub fn succeed(
        &mut self,
        worker: &str,
        output: String,
        transcript: Option<serde_json::Value>,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        self.output = Some(output);
        if let Some(transcript) = transcript {
            self.save_checkpoint(transcript);
        }
        self.complete(RunStatus::Succeeded, now);
        Ok(())
    }

    pub fn fail(&mut self, worker: &str, error: String, now: Timestamp) -> Result<(), TransitionError> {
        self.ensure_held_by(worker)?;
        self.error = Some(error);
        self.complete(RunStatus::Failed, now);
        Ok(())
    }

    /// A run whose queue message was dead-lettered: fail it unless it has
    /// moved on (terminal, awaiting a decision, or held by a live lease).
    pub fn abandon(&mut self, now: Timestamp) -> bool {
        let stuck = match self.status {
            RunStatus::Queued => true,
            RunStatus::Running => self.lease.as_ref().is_none_or(|lease| lease.expires_at <= now),
            _ => false,
        };
        if stuck {
            self.error =
                Some("The run could not be executed: its queue message failed repeatedly and was set aside.".into());
            self.complete(RunStatus::Failed, now);
        }
        stuck
    }

    /// The sweeper could not handle this run, pass after pass: fail it
    /// rather than retry it forever. `false` when it is already terminal.
    pub fn fail_unsweepable(&mut self, now: Timestamp) -> bool {
        if self.status.is_terminal() {
            return false;
        }
        self.cancel_pending_approvals(now);
        self.error = Some("The run could not be recovered after repeated failures; it was stopped.".into());
        self.complete(RunStatus::Failed, now);
        true
    }

    /// The sweeper's look at a run whose due time has passed.
    pub fn sweep(&mut self, now: Timestamp, policy: &ExecutionPolicy) -> SweepAction {
        let due = self.due_at.is_some_and(|due| due <= now);
        if !due {
            return SweepAction::Nothing;
        }
        match self.status {
            RunStatus::Queued => {
                self.resend(now, policy);
                SweepAction::Enqueue
            }
            RunStatus::Running if self.attempts >= policy.max_attempts => {
                self.error = Some(attempts_exhausted_message(policy.max_attempts));
                self.complete(RunStatus::Failed, now);
                SweepAction::Failed
            }
            RunStatus::AwaitingApproval => {
                let mut expired = Vec::new();
                let mut warned = Vec::new();
                for approval in &mut self.approvals {
                    // One with a veto window never expires: it is approved
                    // when the window ends, at the latest at its expiry.
                    let Some(expires_at) = approval
                        .expires_at
                        .filter(|_| approval.status == ApprovalStatus::Pending && approval.auto_approves_at.is_none())
                    else {
                        continue;
                    };
                    if expires_at <= now {
                        approval.status = ApprovalStatus::Expired;
                        approval.resolved_at = Some(now.max(approval.requested_at));
                        expired.push(approval.clone());
                    } else if !approval.expiry_warned && warning_time(expires_at, policy) <= now {
                        approval.expiry_warned = true;
                        warned.push(approval.clone());
                    }
                }
                let Some(action) = expired.first().map(|approval| approval.action.clone()) else {
                    // Nothing expired: windows that ended approve their calls.
                    let auto_approved = self.auto_approve_due(now, policy);
                    if auto_approved == Some(DecideOutcome::Requeued) {
                        // Every approval decided: none was left to warn about.
                        return SweepAction::Enqueue;
                    }
                    if auto_approved.is_none() && warned.is_empty() {
                        return SweepAction::Nothing;
                    }
                    for approval in warned {
                        self.record(now, EventData::ApprovalExpiring(approval));
                    }
                    self.due_at = self.next_approval_due(policy);
                    return if auto_approved.is_some() { SweepAction::AutoApproved } else { SweepAction::Warned };
                };
                for approval in expired {
                    self.record(now, EventData::ApprovalExpired(approval));
                }
                self.cancel_pending_approvals(now);
                self.error = Some(approval_expired_message(&action, policy.approval_timeout));
                self.complete(RunStatus::Failed, now);
                SweepAction::Failed
            }
            RunStatus::Running => {
                // The lease has expired: a worker that receives the message takes over.
                self.due_at = Some(now.plus(policy.requeue_after));
                SweepAction::Enqueue
            }
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Canceled => SweepAction::Nothing,
        }
    }
}
