//! `GET /v1/approvals`: approvals across the owner's runs, newest
//! `requested_at` first, with the list's cursor rules.

use http::StatusCode;

use super::query::{page_size, parameters};
use super::response::json_response;
use super::{ApiError, ApiResponse};
use crate::domain::{ApprovalKind, ApprovalStatus, InboxCursor, Owner, valid_agent_name};
use crate::store::{InboxRequest, RunLists};
use crate::views::{InboxEntryView, PageView};

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
    let page = runs.inbox(owner, InboxRequest { status, agent: agent.clone(), kind, after, limit }).await?;
    let last = page.resume_after.or_else(|| page.entries.last().map(|entry| entry.position()));
    let next_cursor =
        page.has_more.then_some(last).flatten().map(|last| InboxCursor { status, agent, kind, last }.encode(owner));
    let view = PageView { data: page.entries.iter().map(InboxEntryView::from).collect(), next_cursor };
    Ok(json_response(StatusCode::OK, &view))
}
