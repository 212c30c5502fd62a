//! `GET /v1/agent/runs`: newest first, a status filter, keyset cursors.

use http::StatusCode;

use super::query::{page_size, parameters};
use super::response::json_response;
use super::{ApiError, ApiResponse};
use crate::domain::{Cursor, Owner, RunStatus};
use crate::store::{ListRequest, RunStore};
use crate::views::{PageView, RunView};

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;
const PARAMETERS: [&str; 3] = ["status", "limit", "cursor"];

struct ListQuery {
    status: Option<RunStatus>,
    limit: u32,
    cursor: Option<String>,
}

fn parse_query(query: Option<&str>) -> Result<ListQuery, ApiError> {
    let [status, limit, cursor] = parameters(query, PARAMETERS)?;
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
    let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    Ok(ListQuery { status, limit, cursor })
}

pub(super) async fn handle(runs: &dyn RunStore, owner: &Owner, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    let query = parse_query(query)?;
    let before = query
        .cursor
        .map(|text| Cursor::decode(&text, owner, query.status))
        .transpose()
        .map_err(|error| ApiError::invalid("cursor", error.to_string()))?
        .map(|cursor| cursor.last);
    let page = runs.list(owner, ListRequest { status: query.status, before, limit: query.limit }).await?;
    let next_cursor = page
        .has_more
        .then(|| page.runs.last())
        .flatten()
        .map(|last| Cursor { status: query.status, last: last.id }.encode(owner));
    let view = PageView { data: page.runs.iter().map(RunView::from).collect(), next_cursor };
    Ok(json_response(StatusCode::OK, &view))
}
