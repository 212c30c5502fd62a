//! `POST /v1/agent/runs/{run_id}/approvals/{approval_id}/extend`: give a
//! pending approval more time.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use serde_json::Value;

use super::body::{json_object, reject_unknown_fields};
use super::decide::approval_not_found;
use super::{Api, ApiError, ApiResponse, parse_run_id, run_response};
use crate::domain::{ApprovalId, Owner, TransitionError};
use crate::lifecycle::DecideRefused;
use crate::store::ChangeError;

const SECONDS: std::ops::RangeInclusive<u64> = 60..=604_800;

fn seconds(value: Option<Value>) -> Result<Duration, ApiError> {
    let message = || format!("`seconds` is required: a whole number from {} to {}.", SECONDS.start(), SECONDS.end());
    match value.as_ref().and_then(Value::as_u64) {
        Some(seconds) if SECONDS.contains(&seconds) => Ok(Duration::from_secs(seconds)),
        _ => Err(ApiError::invalid("seconds", message())),
    }
}

pub(super) async fn handle(
    api: &Api,
    owner: &Owner,
    run_id: &str,
    approval_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let approval_id: ApprovalId = approval_id.parse().map_err(|_| approval_not_found())?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["seconds"])?;
    let by = seconds(body.remove("seconds"))?;

    let run = api.runs.get(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    match api.lifecycle.extend(run, approval_id, by).await {
        Ok(run) => Ok(run_response(StatusCode::OK, &run)),
        Err(ChangeError::Gone) => Err(ApiError::run_not_found()),
        Err(ChangeError::Refused(DecideRefused::Expired)) => {
            Err(ApiError::Conflict("The approval expired before this request arrived; the run has failed.".into()))
        }
        Err(ChangeError::Refused(DecideRefused::Transition(TransitionError::NoSuchApproval))) => {
            Err(approval_not_found())
        }
        Err(ChangeError::Refused(DecideRefused::Transition(TransitionError::ApprovalAlreadyResolved(status)))) => {
            Err(ApiError::Conflict(format!(
                "The approval is already {}; only a pending approval can be extended.",
                status.as_str()
            )))
        }
        Err(ChangeError::Refused(DecideRefused::Transition(other))) => {
            Err(ApiError::Conflict(format!("The approval cannot be extended: {other}.")))
        }
        Err(ChangeError::Store(error)) => Err(error.into()),
    }
}
