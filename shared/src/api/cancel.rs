//! `POST /v1/agent/runs/{run_id}/cancel`.

use bytes::Bytes;
use http::{Request, StatusCode};

use super::body::{json_object, reject_unknown_fields};
use super::{ApiError, ApiResponse, modify_run, parse_run_id, run_response};
use crate::domain::{Changed, Clock, Owner, TransitionError};
use crate::store::RunStore;

pub(super) async fn handle(
    runs: &dyn RunStore,
    clock: &dyn Clock,
    owner: &Owner,
    run_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let body = json_object(request.headers(), request.body(), true)?;
    reject_unknown_fields(&body, &[])?;
    let (run, ()) = modify_run(runs, owner, run_id, |run| match run.cancel(clock.now()) {
        Ok(changed) => Ok(((), changed == Changed::Yes)),
        Err(TransitionError::InvalidState(status)) => Err(ApiError::Conflict(format!(
            "The run has already {}; only queued, running or awaiting_approval runs can be canceled.",
            status.as_str()
        ))),
        Err(other) => Err(ApiError::Internal(format!("unexpected cancel refusal: {other}"))),
    })
    .await?;
    Ok(run_response(StatusCode::OK, &run))
}
