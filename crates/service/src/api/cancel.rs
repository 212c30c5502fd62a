//! `POST /v1/agent/runs/{run_id}/cancel`.

use bytes::Bytes;
use http::{Method, Request};

use serde_json::{Value, json};

use super::body::{json_object, reject_unknown_fields};
use super::openapi::{Parts, operation, run_response};
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, changed_run_response, parse_run_id};
use crate::commands::RunCommands;
use agent_runs_domain::{Owner, Scope, TransitionError};
use agent_runs_ports::store::ChangeError;
use agent_runs_ports::views::ExtraFields;

pub(super) async fn handle(
    commands: &RunCommands,
    shown: ExtraFields,
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

pub(super) const ROUTE: Route = Route {
    operation: Operation::Cancel,
    method: Method::POST,
    path: "/v1/agent/runs/{run_id}/cancel",
    operation_id: "cancelRun",
    function: "cancel",
    handler: Handler::Keyed {
        scope: Scope::RunsWrite,
        handle: |api, call| {
            Box::pin(handle(&api.commands, api.shown, call.owner(), call.param("run_id"), call.request))
        },
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { run_id, not_found, conflict, .. } = parts;
    operation(
        route.operation_id,
        "Cancel a run",
        json!([run_id]),
        Some(
            json!({"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CancelRun"}}}}),
        ),
        json!({"200": run_response("The run, canceled.", json!({})), "404": not_found.clone(), "409": conflict}),
    )
}
