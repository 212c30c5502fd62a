//! `GET /v1/agent/runs`: newest first, a status filter, keyset cursors.

use super::query::{page_size, parameters};
use super::response::page_response;
use super::{ApiError, ApiResponse, run_id_of};
use agent_runs_domain::{Cursor, Owner, RunId, RunStatus};
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
