//! An answer to a question: checked against the question's schema (which
//! a model may have written) off the threads that answer requests, within
//! a deadline, before anything is written.

use std::time::Duration;

use agent_runs_domain::{ApprovalId, ApprovalStatus, DecisionRequest, Run, Timestamp, TransitionError, check_answer};
use agent_runs_ports::store::{ChangeError, StoreError};

use super::DecideRefused;

/// How long an answer may take to check. Past this nothing is recorded and
/// the caller may try again (`503`: a busy machine, not a wrong answer).
const ANSWER_CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// The answer `request` carries checked against its question as the run
/// `read` has it, on a blocking thread and within [`ANSWER_CHECK_DEADLINE`]
/// (the decision's own check then finds the schema compiled and the
/// answer checked moments ago). An approval no longer pending, or past its
/// expiry, is left to the decision itself, which refuses it for that.
pub(super) async fn check_answer_aside(
    read: &Run,
    now: Timestamp,
    approval_id: ApprovalId,
    request: &DecisionRequest,
) -> Result<(), ChangeError<DecideRefused>> {
    let asked = read.approvals.iter().find(|approval| approval.id == approval_id);
    let pending = asked.is_some_and(|approval| approval.status == ApprovalStatus::Pending)
        && !read.approval_past_expiry(approval_id, now);
    let (Some(schema), Some(answer)) = (
        asked.and_then(|approval| approval.input_schema.clone()).filter(|_| pending),
        request.decision.answer().cloned(),
    ) else {
        return Ok(());
    };
    let checking = tokio::task::spawn_blocking(move || check_answer(&schema, &answer));
    match tokio::time::timeout(ANSWER_CHECK_DEADLINE, checking).await {
        Ok(Ok(checked)) => checked.map_err(|problem| {
            ChangeError::Refused(DecideRefused::Transition(TransitionError::AnswerRefused(problem)))
        }),
        Ok(Err(failed)) => Err(ChangeError::Store(StoreError::Defect(format!("the answer check failed: {failed}")))),
        Err(_) => Err(ChangeError::Store(StoreError::Refused(
            format!("the answer was not checked within {} seconds", ANSWER_CHECK_DEADLINE.as_secs()).into(),
        ))),
    }
}
