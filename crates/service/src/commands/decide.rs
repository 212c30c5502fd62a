//! Decide: a person approves, rejects, edits or answers one pending
//! approval. Who may (another key than the creator's when the agent wants
//! a separate approver), what an edit may be (the tool's arguments
//! schema), what an answer may be (the question's schema), judged at the
//! time the decision arrived; the run is queued again when it was the last
//! decision it waited for.

use agent_runs_domain::{
    Approval, ApprovalId, ApprovalStatus, DecideOutcome, Decision, DecisionRequest, Run, RunId, Timestamp,
    TransitionError,
};
use agent_runs_ports::store::{ChangeError, Transition, change_run};

use super::answer::check_answer_aside;
use super::{DecideRefused, RunCommands, WritesSeen};
use crate::auth::Principal;

impl RunCommands {
    pub async fn decide(
        &self,
        by: &Principal,
        run_id: RunId,
        approval_id: ApprovalId,
        request: DecisionRequest,
    ) -> Result<Run, ChangeError<DecideRefused>> {
        let read = self.run_to_decide(by, run_id).await?;
        self.check_decision(by, &read, approval_id, &request).await?;
        // A decision is judged at the time it arrived: its answer's check
        // does not count against the approval's expiry or window.
        let arrived = self.clock.now();
        check_answer_aside(&read, arrived, approval_id, &request).await?;
        self.record_decision(read, approval_id, request, arrived).await
    }

    /// What is checked of a decision before any write, in the contract's
    /// order: the decider, the approval, an edit's arguments. (An answer is
    /// checked next, against the run about to be written.)
    pub(super) async fn check_decision(
        &self,
        by: &Principal,
        run: &Run,
        approval_id: ApprovalId,
        request: &DecisionRequest,
    ) -> Result<(), ChangeError<DecideRefused>> {
        self.check_separate_approver(by, run).await?;
        let approval = approval_of(run, approval_id)?;
        if let Decision::Edit(arguments) = &request.decision {
            let Some(call) = &approval.call else {
                return Err(ChangeError::Refused(DecideRefused::NothingToEdit(approval.kind())));
            };
            // A decided approval is left to the repeat rules: the same edit
            // again is 200 even if the definition changed since.
            if approval.status == ApprovalStatus::Pending
                && let Err(problem) = self.agents.check_tool_arguments(&run.agent, &call.tool, arguments).await?
            {
                return Err(ChangeError::Refused(DecideRefused::ArgumentsRefused(problem)));
            }
        }
        Ok(())
    }

    /// Records a decision on `read`, the run as it was read (tried first; a
    /// fresh read when it changed meanwhile). When it was the last one the
    /// run waited for, the run is queued again (should that send fail, the
    /// sweeper sends it).
    async fn record_decision(
        &self,
        read: Run,
        approval_id: ApprovalId,
        request: DecisionRequest,
        arrived: Timestamp,
    ) -> Result<Run, ChangeError<DecideRefused>> {
        let (owner, run_id) = (read.owner.clone(), read.id);
        let mut writes = WritesSeen::default();
        let (run, outcome) = change_run(self.runs.as_ref(), &owner, run_id, Some(read), |run| {
            writes.next_attempt();
            let now = arrived;
            if run.expire_if_due(approval_id, now, &self.policy) {
                return Ok(writes.note(Transition::Write(None)));
            }
            // Past its veto window, the approval is approved first: an
            // approve then repeats it, anything else is refused.
            let auto = run.auto_approve_if_due(approval_id, now, &self.policy);
            let decided =
                run.decide(approval_id, request.clone(), now, &self.policy).map_err(DecideRefused::Transition)?;
            let outcome = auto.map_or(decided, |auto| auto.max(decided));
            Ok(writes.note(Transition::write_if(outcome != DecideOutcome::Unchanged, Some(outcome))))
        })
        .await?;
        // A decision already made (this call's, whose answer was lost, or an
        // earlier request's answered 503 after it landed) reads back as
        // unchanged: a run still queued with nothing pending is sent all the
        // same, as a create's replay is. A duplicate message is dropped by
        // the worker's claim; a missing one would leave the run to the
        // sweeper's requeue a minute later.
        let requeued_unseen = outcome == Some(DecideOutcome::Unchanged) && run.is_requeued_after_decisions();
        if outcome.is_none() {
            return Err(ChangeError::Refused(DecideRefused::Expired));
        }
        if outcome == Some(DecideOutcome::Requeued) || requeued_unseen {
            // This call's own write (that may have landed) owes its send;
            // only a repeat of another request's decision is spaced.
            self.send_decided(&run, requeued_unseen && !writes.may_have_landed).await;
        }
        Ok(run)
    }
}

/// The approval `approval_id` of `run`, or why there is none.
fn approval_of(run: &Run, approval_id: ApprovalId) -> Result<&Approval, ChangeError<DecideRefused>> {
    run.approvals
        .iter()
        .find(|approval| approval.id == approval_id)
        .ok_or(ChangeError::Refused(DecideRefused::Transition(TransitionError::NoSuchApproval)))
}
