//! Decisions on a run's approvals: a person's (decide, extend), a veto
//! window's end (approved as `timeout`), and what is due next.

use std::time::Duration;

use crate::approval::{
    Approval, ApprovalStatus, Decision, DecisionRequest, MAX_APPROVAL_ARGUMENTS_PER_RUN, Resolver,
    approval_arguments_bytes, canonical_json,
};
use crate::event::EventData;
use crate::ids::ApprovalId;
use crate::question::check_answer;
use crate::run::{Changed, DecideOutcome, ExecutionPolicy, Run, SweepAction, TransitionError, warning_time};
use crate::run_values::RunStatus;
use crate::time::Timestamp;

impl Run {
    /// When the sweeper must look at an awaiting run: the first pending
    /// approval's warning, its expiry once warned, or the end of its veto
    /// window.
    pub(super) fn next_approval_due(&self, policy: &ExecutionPolicy) -> Option<Timestamp> {
        self.approvals
            .iter()
            .filter(|approval| approval.status == ApprovalStatus::Pending)
            .filter_map(|approval| {
                // One with a veto window is approved then, never warned
                // about or expired.
                approval.auto_approves_at.or_else(|| {
                    let expires_at = approval.expires_at?;
                    let warn = !approval.expiry_warned && !policy.approval_warning.is_zero();
                    Some(if warn { warning_time(expires_at, policy) } else { expires_at })
                })
            })
            .min()
    }

    /// Approves, as `timeout`, every pending approval whose veto window has
    /// ended; the run is queued again when none is left pending. `None`
    /// when none was due.
    pub fn auto_approve_due(&mut self, now: Timestamp, policy: &ExecutionPolicy) -> Option<DecideOutcome> {
        if self.status != RunStatus::AwaitingApproval {
            return None;
        }
        let mut approved = Vec::new();
        for approval in &mut self.approvals {
            if approval.status == ApprovalStatus::Pending && approval.auto_approves_at.is_some_and(|at| at <= now) {
                approval.status = ApprovalStatus::Approved;
                approval.resolved_at = Some(now.max(approval.requested_at));
                approval.resolved_by = Some(Resolver::Timeout);
                approved.push(approval.clone());
            }
        }
        if approved.is_empty() {
            return None;
        }
        for approval in approved {
            self.record(now, EventData::ApprovalDecided(approval));
        }
        Some(self.resume_when_decided(now, policy))
    }

    /// After a decision: the run goes on once no approval is pending;
    /// until then the next warning, expiry or window end is due.
    fn resume_when_decided(&mut self, now: Timestamp, policy: &ExecutionPolicy) -> DecideOutcome {
        if self.approvals.iter().any(|approval| approval.status == ApprovalStatus::Pending) {
            // The decided one may have been the next to warn about or expire.
            self.due_at = self.next_approval_due(policy);
            return DecideOutcome::Recorded;
        }
        self.requeue(now, policy);
        self.record(now, EventData::RunResumed);
        DecideOutcome::Requeued
    }

    /// Approves the approval as `timeout` when it is still pending past
    /// its veto window (the sweeper has not come by yet), with any other
    /// due: the window has the last word over a late decision.
    pub fn auto_approve_if_due(
        &mut self,
        approval_id: ApprovalId,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Option<DecideOutcome> {
        let due = self.approvals.iter().any(|approval| {
            approval.id == approval_id
                && approval.status == ApprovalStatus::Pending
                && approval.auto_approves_at.is_some_and(|at| at <= now)
        });
        if due { self.auto_approve_due(now, policy) } else { None }
    }

    /// Whether the approval is pending though its time is up (the sweeper
    /// has not come by yet): no decision may count.
    pub fn approval_past_expiry(&self, approval_id: ApprovalId, now: Timestamp) -> bool {
        self.approvals.iter().any(|approval| {
            approval.id == approval_id
                && approval.status == ApprovalStatus::Pending
                && approval.auto_approves_at.is_none()
                && approval.expires_at.is_some_and(|at| at <= now)
        })
    }

    /// Queued with every approval decided: what the last decision leaves
    /// (until a worker claims the run).
    pub fn is_requeued_after_decisions(&self) -> bool {
        self.status == RunStatus::Queued
            && !self.approvals.is_empty()
            && self.approvals.iter().all(|approval| approval.status != ApprovalStatus::Pending)
    }

    /// Expires the approval, failing the run, when it is still pending and
    /// its time is up though the sweeper has not come by yet: a late
    /// decision never counts. `true` when it expired here.
    pub fn expire_if_due(&mut self, approval_id: ApprovalId, now: Timestamp, policy: &ExecutionPolicy) -> bool {
        self.approval_past_expiry(approval_id, now) && self.sweep(now, policy) == SweepAction::Failed
    }

    pub fn decide(
        &mut self,
        approval_id: ApprovalId,
        request: DecisionRequest,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<DecideOutcome, TransitionError> {
        let approval = self.approval_mut(approval_id)?;
        if request.seen_sha256.is_some() && request.seen_sha256 != approval.arguments_sha256() {
            return Err(TransitionError::ArgumentsChanged);
        }
        match (&approval.input_schema, &request.decision) {
            (None, Decision::Answer(_)) => return Err(TransitionError::NotAQuestion),
            (Some(_), Decision::Approve | Decision::Edit(_)) => return Err(TransitionError::QuestionNeedsAnAnswer),
            _ => {}
        }
        if approval.call.is_none() && request.decision.edited_arguments().is_some() {
            return Err(TransitionError::NothingToEdit);
        }
        let status = request.decision.resulting_status();
        let edited_arguments = request.decision.edited_arguments().cloned();
        let answer = request.decision.answer().cloned();
        match approval.status {
            ApprovalStatus::Pending => {}
            // Compared as the digest's text: `100.0` sent again is the `100`
            // stored (a store keeps the canonical text).
            decided
                if decided == status
                    && approval.edited_arguments.as_ref().map(canonical_json)
                        == edited_arguments.as_ref().map(canonical_json)
                    && approval.answer.as_ref().map(canonical_json) == answer.as_ref().map(canonical_json) =>
            {
                return Ok(DecideOutcome::Unchanged);
            }
            decided => return Err(TransitionError::ApprovalAlreadyResolved(decided)),
        }
        if let (Some(schema), Some(answer)) = (&approval.input_schema, &answer) {
            check_answer(schema, answer).map_err(TransitionError::AnswerRefused)?;
        }
        if self.status != RunStatus::AwaitingApproval {
            // Pending approvals exist only while awaiting; anything else is a
            // corrupted record, refused rather than made worse.
            return Err(TransitionError::InvalidState(self.status));
        }
        if let Some(added) = edited_arguments.as_ref().or(answer.as_ref()) {
            let held = approval_arguments_bytes(&self.approvals);
            if held + canonical_json(added).len() > MAX_APPROVAL_ARGUMENTS_PER_RUN {
                return Err(TransitionError::TooManyArguments);
            }
        }
        let approval = self.approval_mut(approval_id)?;
        approval.status = status;
        approval.resolved_at = Some(now.max(approval.requested_at));
        approval.comment = request.comment;
        approval.resolved_by = request.decided_by.map(Resolver::Key);
        approval.edited_arguments = edited_arguments;
        approval.answer = answer;
        let decided = approval.clone();
        self.record(now, EventData::ApprovalDecided(decided));
        Ok(self.resume_when_decided(now, policy))
    }

    fn approval_mut(&mut self, approval_id: ApprovalId) -> Result<&mut Approval, TransitionError> {
        self.approvals.iter_mut().find(|approval| approval.id == approval_id).ok_or(TransitionError::NoSuchApproval)
    }

    /// Moves a pending approval's expiry (and the end of its veto window)
    /// to `now + by`, never earlier than it was; the warning before it is
    /// due again. An approval whose time
    /// is already up is not extended: the caller expires it first.
    pub fn extend_approval(
        &mut self,
        approval_id: ApprovalId,
        by: Duration,
        now: Timestamp,
        policy: &ExecutionPolicy,
    ) -> Result<Changed, TransitionError> {
        let run_status = self.status;
        let approval = self.approval_mut(approval_id)?;
        if approval.status != ApprovalStatus::Pending {
            return Err(TransitionError::ApprovalAlreadyResolved(approval.status));
        }
        if run_status != RunStatus::AwaitingApproval {
            return Err(TransitionError::InvalidState(run_status));
        }
        let extended = now.plus(by);
        let window_moves = approval.auto_approves_at.is_some_and(|at| at < extended);
        if approval.expires_at.is_some_and(|at| at >= extended) && !window_moves {
            return Ok(Changed::No);
        }
        if window_moves {
            approval.auto_approves_at = Some(extended);
        }
        if approval.expires_at.is_none_or(|at| at < extended) {
            approval.expires_at = Some(extended);
            approval.expiry_warned = false;
        }
        let approval = approval.clone();
        self.record(now, EventData::ApprovalExtended(approval));
        self.due_at = self.next_approval_due(policy);
        Ok(Changed::Yes)
    }
}
