//! `GET /v1/agent/runs/{run_id}`: the polling target.

use http::StatusCode;

use super::{ApiError, ApiResponse, parse_run_id, run_response};
use crate::domain::Owner;
use crate::store::RunStore;
use crate::views::Shown;

pub(super) async fn handle(
    runs: &dyn RunStore,
    shown: Shown,
    owner: &Owner,
    run_id: &str,
) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let run = runs.get(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok(run_response(StatusCode::OK, &run, shown))
}
