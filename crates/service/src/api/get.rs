//! `GET /v1/agent/runs/{run_id}`: the polling target.

use bytes::Bytes;
use http::StatusCode;

use super::response::json_bytes_response;
use super::{ApiError, ApiResponse, parse_run_id};
use agent_runs_domain::Owner;
use agent_runs_ports::store::RunLists;

/// The run as the store keeps it for clients (the same JSON a list shows).
pub(super) async fn handle(runs: &dyn RunLists, owner: &Owner, run_id: &str) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let view = runs.view(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok(json_bytes_response(StatusCode::OK, Bytes::copy_from_slice(view.as_bytes())))
}
