//! `GET /v1/approvals`: approvals across the owner's runs, newest
//! `requested_at` first, with the list's cursor rules.

use serde_json::{Value, json};

use http::Method;

use super::openapi::{Parts, operation};
use super::query::{page_size, parameters};
use super::response::page_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse};
use agent_runs_domain::{ApprovalKind, ApprovalStatus, InboxCursor, Owner, Scope, valid_agent_name};
use agent_runs_ports::store::{InboxRequest, RunLists};

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;
const PARAMETERS: [&str; 5] = ["status", "agent", "kind", "limit", "cursor"];

pub(super) async fn handle(runs: &dyn RunLists, owner: &Owner, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    let [status, agent, kind, limit, cursor] = parameters(query, PARAMETERS)?;
    let status = match status {
        None => ApprovalStatus::Pending,
        Some(text) => ApprovalStatus::parse(&text).ok_or_else(|| {
            ApiError::invalid(
                "status",
                "`status` must be one of pending, approved, rejected, canceled, expired, answered.",
            )
        })?,
    };
    let kind = kind
        .map(|text| {
            ApprovalKind::parse(&text)
                .ok_or_else(|| ApiError::invalid("kind", "`kind` must be one of action, tool_call, input."))
        })
        .transpose()?;
    if agent.as_deref().is_some_and(|agent| !valid_agent_name(agent)) {
        return Err(ApiError::invalid("agent", "`agent` must be an agent's name: letters, digits, `_` and `-`."));
    }
    let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let after = cursor
        .map(|text| InboxCursor::decode(&text, owner, status, agent.as_deref(), kind))
        .transpose()
        .map_err(|error| ApiError::invalid("cursor", error.to_string()))?
        .map(|cursor| cursor.last);
    let page = runs.inbox_views(owner, InboxRequest { status, agent: agent.clone(), kind, after, limit }).await?;
    let next_cursor = page
        .has_more
        .then_some(page.last)
        .flatten()
        .map(|last| InboxCursor { status, agent, kind, last }.encode(owner));
    Ok(page_response(&page.views, next_cursor))
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Inbox,
    method: Method::GET,
    path: "/v1/approvals",
    operation_id: "listApprovals",
    function: "approvals",
    handler: Handler::Keyed {
        scope: Scope::ApprovalsDecide,
        handle: |api, call| Box::pin(handle(api.runs.as_ref(), call.owner(), call.query())),
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { approval_statuses, .. } = parts;
    operation(
        route.operation_id,
        "List approvals across runs, newest requested first",
        json!([
            {"name": "status", "in": "query", "required": false, "description": "Only approvals in this state (default pending). Empty is the same as absent.", "schema": {"type": "string", "enum": approval_statuses.iter().copied().chain([""]).collect::<Vec<_>>(), "default": "pending"}},
            {"name": "agent", "in": "query", "required": false, "description": "Only approvals of runs of this agent. Empty is the same as absent.", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]*$"}},
            {"name": "kind", "in": "query", "required": false, "description": "Only approvals of this kind (`input`: questions). Empty is the same as absent.", "schema": {"type": "string", "enum": ["action", "tool_call", "input", ""]}},
            {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, {"const": ""}], "default": DEFAULT_LIMIT}},
            {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status, agent and kind filters.", "schema": {"type": "string"}}
        ]),
        None,
        json!({
            "200": {
                "description": "One page of approvals.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApprovalList"}}}
            }
        }),
    )
}
