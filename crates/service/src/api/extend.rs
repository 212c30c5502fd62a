//! `POST /v1/agent/runs/{run_id}/approvals/{approval_id}/extend`: give a
//! pending approval more time.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use serde_json::{Value, json};

use super::body::{json_object, reject_unknown_fields, whole_number};
use super::decide::{parse_approval_path, refused};
use super::openapi::{Parts, error_response, operation, run_response};
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, changed_run_response};
use crate::auth::Principal;
use crate::commands::RunCommands;
use agent_runs_domain::Scope;
use agent_runs_ports::views::ExtraFields;

const SECONDS: std::ops::RangeInclusive<u64> = 60..=604_800;

fn seconds(value: Option<Value>) -> Result<Duration, ApiError> {
    let message = || format!("`seconds` is required: a whole number from {} to {}.", SECONDS.start(), SECONDS.end());
    match value.as_ref().and_then(whole_number) {
        Some(seconds) if SECONDS.contains(&seconds) => Ok(Duration::from_secs(seconds)),
        _ => Err(ApiError::invalid("seconds", message())),
    }
}

pub(super) async fn handle(
    commands: &RunCommands,
    shown: ExtraFields,
    by: &Principal,
    run_id: &str,
    approval_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let (run_id, approval_id) = parse_approval_path(run_id, approval_id)?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["seconds"])?;
    let extension = seconds(body.remove("seconds"))?;
    match commands.extend(by, run_id, approval_id, extension).await {
        Ok(run) => Ok(changed_run_response(&run, shown)),
        Err(error) => Err(refused(error, |status| {
            format!("The approval is already {}; only a pending approval can be extended.", status.as_str())
        })),
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Extend,
    method: Method::POST,
    path: "/v1/agent/runs/{run_id}/approvals/{approval_id}/extend",
    operation_id: "extendApproval",
    function: "extend",
    handler: Handler::Keyed {
        scope: Scope::ApprovalsDecide,
        handle: |api, call| {
            Box::pin(handle(
                &api.commands,
                api.shown,
                call.by,
                call.param("run_id"),
                call.param("approval_id"),
                call.request,
            ))
        },
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { run_id, approval_id, not_found, .. } = parts;
    operation(
        route.operation_id,
        "Give a pending approval more time",
        json!([run_id, approval_id]),
        Some(
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Extension"}}}}),
        ),
        json!({
            "200": run_response("The run, with the approval's new expires_at (never earlier than it was).", json!({})),
            "404": not_found.clone(),
            "409": error_response("The approval is not pending (an expired one never runs).", &[])
        }),
    )
}
