//! The wire form of a Run: every key always present, unknown values `null`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain::{Approval, Run, Timestamp, Usage};

#[derive(Serialize)]
pub struct RunView<'a> {
    id: String,
    status: &'static str,
    agent: &'a str,
    input: &'a str,
    output: Option<&'a str>,
    error: Option<&'a str>,
    pending_approvals: Vec<ApprovalView<'a>>,
    metadata: &'a BTreeMap<String, String>,
    created_at: String,
    started_at: Option<String>,
    completed_at: Option<String>,
    /// An addition to the contract's keys: present only once the agent's
    /// model has reported token usage, so other runs show exactly the
    /// contract's eleven keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
pub struct ApprovalView<'a> {
    id: String,
    action: &'a str,
    status: &'static str,
    requested_at: String,
    resolved_at: Option<String>,
    comment: Option<&'a str>,
    expires_at: Option<String>,
}

fn rfc3339(at: Option<Timestamp>) -> Option<String> {
    at.map(Timestamp::to_rfc3339)
}

impl<'a> From<&'a Approval> for ApprovalView<'a> {
    fn from(approval: &'a Approval) -> Self {
        ApprovalView {
            id: approval.id.to_string(),
            action: &approval.action,
            status: approval.status.as_str(),
            requested_at: approval.requested_at.to_rfc3339(),
            resolved_at: rfc3339(approval.resolved_at),
            comment: approval.comment.as_deref(),
            expires_at: rfc3339(approval.expires_at),
        }
    }
}

impl<'a> From<&'a Run> for RunView<'a> {
    fn from(run: &'a Run) -> Self {
        RunView {
            id: run.id.to_string(),
            status: run.status.as_str(),
            agent: &run.agent,
            input: &run.input,
            output: run.output.as_deref(),
            error: run.error.as_deref(),
            pending_approvals: run.approvals.iter().map(ApprovalView::from).collect(),
            metadata: &run.metadata,
            created_at: run.created_at.to_rfc3339(),
            started_at: rfc3339(run.started_at),
            completed_at: rfc3339(run.completed_at),
            usage: run.usage,
        }
    }
}

#[derive(Serialize)]
pub struct ListView<'a> {
    pub data: Vec<RunView<'a>>,
    pub next_cursor: Option<String>,
}
