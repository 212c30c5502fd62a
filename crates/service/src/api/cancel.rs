//! `POST /v1/agent/runs/{run_id}/cancel`.

use bytes::Bytes;
use http::Request;

use super::body::{json_object, reject_unknown_fields};
use super::{ApiError, ApiResponse, changed_run_response, parse_run_id};
use crate::commands::RunCommands;
use agent_runs_domain::{Owner, TransitionError};
use agent_runs_ports::store::ChangeError;
use agent_runs_ports::views::Shown;

pub(super) async fn handle(
    commands: &RunCommands,
    shown: Shown,
    owner: &Owner,
    run_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let body = json_object(request.headers(), request.body(), true)?;
    reject_unknown_fields(&body, &[])?;
    match commands.cancel(owner, run_id).await {
        Ok(run) => Ok(changed_run_response(&run, shown)),
        Err(ChangeError::Gone) => Err(ApiError::run_not_found()),
        Err(ChangeError::Refused(TransitionError::InvalidState(status))) => Err(ApiError::Conflict(format!(
            "The run has already {}; only queued, running or awaiting_approval runs can be canceled.",
            status.as_str()
        ))),
        Err(ChangeError::Refused(other)) => Err(ApiError::Internal(Box::new(other))),
        Err(ChangeError::Store(error)) => Err(error.into()),
    }
}
