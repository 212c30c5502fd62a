//! `GET /v1/agent/runs/{run_id}`: the polling target.

use bytes::Bytes;
use http::{Method, StatusCode};

use serde_json::{Value, json};

use super::openapi::{Parts, operation};
use super::response::json_bytes_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, parse_run_id};
use agent_runs_domain::{Owner, Scope};
use agent_runs_ports::store::RunLists;

/// The run as the store keeps it for clients (the same JSON a list shows).
pub(super) async fn handle(runs: &dyn RunLists, owner: &Owner, run_id: &str) -> Result<ApiResponse, ApiError> {
    let run_id = parse_run_id(run_id)?;
    let view = runs.run_json(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok(json_bytes_response(StatusCode::OK, Bytes::copy_from_slice(view.as_bytes())))
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Get,
    method: Method::GET,
    path: "/v1/agent/runs/{run_id}",
    operation_id: "getRun",
    function: "get",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(handle(api.runs.as_ref(), call.owner(), call.param("run_id"))),
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { run_id, not_found, .. } = parts;
    operation(
        route.operation_id,
        "Get a run",
        json!([run_id]),
        None,
        json!({
            "200": {
                "description": "The run.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
                "links": {
                    "DecideFirstApproval": {
                        "operationId": "decideApproval",
                        "parameters": {"run_id": "$response.body#/id", "approval_id": "$response.body#/pending_approvals/0/id"}
                    }
                }
            },
            "404": not_found
        }),
    )
}
