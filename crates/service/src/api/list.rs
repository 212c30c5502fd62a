//! `GET /v1/agent/runs`: newest first, a status filter, keyset cursors.

use serde_json::{Value, json};

use http::Method;

use super::openapi::{Parts, ULID, operation};
use super::query::{page_size, parameters};
use super::response::page_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, run_id_of};
use agent_runs_domain::{Cursor, Owner, RunId, RunStatus, Scope};
use agent_runs_ports::store::{ListRequest, RunLists};

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;
const PARAMETERS: [&str; 4] = ["status", "limit", "cursor", "thread_id"];

struct ListQuery {
    status: Option<RunStatus>,
    thread: Option<RunId>,
    limit: u32,
    cursor: Option<String>,
}

fn parse_query(query: Option<&str>) -> Result<ListQuery, ApiError> {
    let [status, limit, cursor, thread] = parameters(query, PARAMETERS)?;
    let status = status
        .map(|text| {
            RunStatus::parse(&text).ok_or_else(|| {
                ApiError::invalid(
                    "status",
                    "`status` must be one of queued, running, awaiting_approval, succeeded, failed, canceled.",
                )
            })
        })
        .transpose()?;
    let thread = thread.map(|text| run_id_of("thread_id", &text)).transpose()?;
    let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    Ok(ListQuery { status, thread, limit, cursor })
}

pub(super) async fn handle(runs: &dyn RunLists, owner: &Owner, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    let query = parse_query(query)?;
    let before = query
        .cursor
        .map(|text| Cursor::decode(&text, owner, query.status, query.thread))
        .transpose()
        .map_err(|error| ApiError::invalid("cursor", error.to_string()))?
        .map(|cursor| cursor.last);
    let request = ListRequest { status: query.status, thread: query.thread, before, limit: query.limit };
    let page = runs.list_views(owner, request).await?;
    let next_cursor = page
        .has_more
        .then_some(page.last)
        .flatten()
        .map(|last| Cursor { status: query.status, thread: query.thread, last }.encode(owner));
    Ok(page_response(&page.views, next_cursor))
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::List,
    method: Method::GET,
    path: "/v1/agent/runs",
    operation_id: "listRuns",
    function: "list",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(handle(api.runs.as_ref(), call.owner(), call.query())),
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { statuses, .. } = parts;
    operation(
        route.operation_id,
        "List runs, newest first",
        json!([
            {"name": "status", "in": "query", "required": false, "description": "Only runs in this state. Empty is the same as absent.", "schema": {"type": "string", "enum": statuses.iter().copied().chain([""]).collect::<Vec<_>>()}},
            {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, {"const": ""}], "default": DEFAULT_LIMIT}},
            {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status and thread filters.", "schema": {"type": "string"}},
            {"name": "thread_id", "in": "query", "required": false, "description": "Only the runs of this conversation (a run's `thread_id`): its first run and every run continuing it, newest first. Another owner's thread is an empty page. Empty is the same as absent.", "schema": {"type": "string", "pattern": format!("^(run_{ULID})?$")}}
        ]),
        None,
        json!({
            "200": {
                "description": "One page of runs.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunList"}}}
            }
        }),
    )
}
