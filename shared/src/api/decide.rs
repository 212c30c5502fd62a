//! `POST /v1/agent/runs/{run_id}/approvals/{approval_id}`: approve or reject.

use bytes::Bytes;
use http::{Request, StatusCode};
use serde_json::Value;

use super::body::{json_object, optional_string, reject_unknown_fields};
use super::{Api, ApiError, ApiResponse, parse_run_id, run_response};
use crate::auth::Principal;
use crate::domain::{ApprovalId, Comment, Decision, TransitionError};
use crate::lifecycle::DecideRefused;
use crate::store::ChangeError;

fn approval_not_found() -> ApiError {
    ApiError::NotFound("The run has no approval with that id.".into())
}

fn parse_decision(value: Option<Value>) -> Result<Decision, ApiError> {
    match value.as_ref().and_then(Value::as_str) {
        Some("approve") => Ok(Decision::Approve),
        Some("reject") => Ok(Decision::Reject),
        _ if value.is_none() || value == Some(Value::Null) => {
            Err(ApiError::invalid("decision", "`decision` is required: \"approve\" or \"reject\"."))
        }
        _ => Err(ApiError::invalid("decision", "`decision` must be \"approve\" or \"reject\".")),
    }
}

pub(super) async fn handle(
    api: &Api,
    by: &Principal,
    run_id: &str,
    approval_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let approval_id: ApprovalId = approval_id.parse().map_err(|_| approval_not_found())?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["decision", "comment"])?;
    let decision = parse_decision(body.remove("decision"))?;
    let comment = optional_string(&mut body, "comment")?
        .map(|text| Comment::parse(text).map_err(|error| ApiError::invalid("comment", error.0)))
        .transpose()?
        .map(Comment::into_string);

    let run = api.runs.get(&by.owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    if run.created_by == Some(by.key_id) && api.agents.requires_separate_approver(&run.agent).await? {
        return Err(ApiError::Forbidden(format!(
            "The agent `{}` wants its runs' approvals decided by another API key than the one that created the run.",
            run.agent
        )));
    }
    match api.lifecycle.decide(run, approval_id, decision, comment, by.key_id).await {
        Ok(run) => Ok(run_response(StatusCode::OK, &run)),
        Err(ChangeError::Gone) => Err(ApiError::run_not_found()),
        Err(ChangeError::Refused(DecideRefused::Expired)) => {
            Err(ApiError::Conflict("The approval expired before this decision arrived; the run has failed.".into()))
        }
        Err(ChangeError::Refused(DecideRefused::Transition(TransitionError::NoSuchApproval))) => {
            Err(approval_not_found())
        }
        Err(ChangeError::Refused(DecideRefused::Transition(TransitionError::ApprovalAlreadyResolved(status)))) => {
            Err(ApiError::Conflict(format!(
                "The approval is already {}; it can no longer be {}.",
                status.as_str(),
                if decision == Decision::Approve { "approved" } else { "rejected" }
            )))
        }
        Err(ChangeError::Refused(DecideRefused::Transition(other))) => {
            Err(ApiError::Conflict(format!("The approval cannot be decided: {other}.")))
        }
        Err(ChangeError::Store(error)) => Err(error.into()),
    }
}
