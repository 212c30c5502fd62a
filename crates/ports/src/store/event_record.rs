//! An event's data as both stores keep it: SQLite's `data` column and
//! DynamoDB's `data` attribute hold this record, not the JSON clients get,
//! so that what clients see of history is rendered when it is read (a
//! later API version can render it differently; whether a run shows its
//! trace is decided by the deployment that serves it).
//!
//! Format 1 is what stores wrote before this record: the event's JSON as
//! clients got it, rendered when written. It is read back as it is. Format
//! 2 is the record below; the event's type (stored beside it) names the
//! shape of its data. A field added later must read as its default from
//! older records, and a record that does not read back is a
//! [`StoreError::Defect`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::record::{StoredApproval, StoredBudget, StoredPolicyMatch, StoredThread, StoredUsage, at, millis};
use crate::views::{ExtraFields, event_data_json};
use agent_runs_domain::{
    Approval, ApprovalKind, ApprovalStatus, ApprovalSummary, EventData, EventText, RunSnapshot, RunStatus, ThreadLink,
    Timestamp, ToolCompleted,
};

/// The format stores write.
pub const EVENT_FORMAT: u8 = 2;
/// Events written before the record (no format stored).
pub const RENDERED_FORMAT: u8 = 1;

/// An event's data as a store keeps it: the text and its format. It is
/// decoded only when shown, so that what cannot be read fails where it is
/// shown (an events page, one webhook attempt), never the reads around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBody {
    format: u8,
    text: String,
}

impl EventBody {
    /// What a store read: `text` in `format`.
    pub fn stored(format: u8, text: String) -> Self {
        EventBody { format, text }
    }

    /// `data` as stores write it in `format` (rendered as `shown`).
    pub fn written(data: &EventData, format: EventFormat, shown: ExtraFields) -> Self {
        match format {
            EventFormat::Record => EventBody { format: EVENT_FORMAT, text: encode_event(data) },
            EventFormat::Rendered => EventBody { format: RENDERED_FORMAT, text: event_data_json(data, shown) },
        }
    }

    pub fn format(&self) -> u8 {
        self.format
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// What the event of type `kind` says; `None` for an event written as
    /// rendered JSON.
    pub fn decode(&self, kind: &str) -> Result<Option<EventData>, StoreError> {
        match self.format {
            RENDERED_FORMAT => Ok(None),
            EVENT_FORMAT => decode_event(kind, &self.text).map(Some),
            format => Err(StoreError::Defect(format!("stored event: unknown format {format}"))),
        }
    }

    /// The data of the event of type `kind` as clients get it from this
    /// deployment.
    pub fn render(&self, kind: &str, shown: ExtraFields) -> Result<Cow<'_, str>, StoreError> {
        Ok(match self.decode(kind)? {
            None => Cow::Borrowed(&self.text),
            Some(data) => Cow::Owned(event_data_json(&data, shown)),
        })
    }
}

/// Which format stores write events in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// The stored record, rendered on read.
    #[default]
    Record,
    /// The JSON clients get, rendered at write: while a deployment may
    /// still run a release from before the record (a deploy over one, or a
    /// rollback to it), which would serve a record as it is.
    Rendered,
}

/// The stored text of `data`, in [`EVENT_FORMAT`].
fn encode_event(data: &EventData) -> String {
    let encoded = match data {
        EventData::RunCreated(run)
        | EventData::RunSucceeded(run)
        | EventData::RunFailed(run)
        | EventData::RunCanceled(run) => serde_json::to_string(&StoredSnapshot::from(run.as_ref())),
        EventData::RunStarted { attempt } => serde_json::to_string(&StoredStart { attempt: *attempt }),
        EventData::RunAwaitingApproval { approval_ids } => serde_json::to_string(&StoredAwaiting {
            approval_ids: approval_ids.iter().map(ToString::to_string).collect(),
        }),
        EventData::RunResumed | EventData::RunRequeued => Ok("{}".to_owned()),
        EventData::ApprovalRequested(approval)
        | EventData::ApprovalDecided(approval)
        | EventData::ApprovalExpiring(approval)
        | EventData::ApprovalExtended(approval)
        | EventData::ApprovalExpired(approval)
        | EventData::ApprovalCanceled(approval) => serde_json::to_string(&StoredApproval::from(approval)),
        EventData::OutputAppended { text } => serde_json::to_string(&StoredText::from(text)),
        EventData::ModelResponded { text, tool_calls, usage } => serde_json::to_string(&StoredReply {
            text: text.into(),
            tool_calls: tool_calls.clone(),
            usage: usage.map(StoredUsage::from),
        }),
        EventData::ContextTruncated { dropped_turns, dropped_bytes } => {
            serde_json::to_string(&StoredTruncation { dropped_turns: *dropped_turns, dropped_bytes: *dropped_bytes })
        }
        EventData::ToolCompleted(call) => serde_json::to_string(&StoredToolCall {
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            http_status: call.http_status,
            duration_ms: call.duration_ms,
            result: (&call.result).into(),
            mcp_server: call.mcp_server.clone(),
            policy: call.policy.as_ref().map(StoredPolicyMatch::from),
        }),
    };
    // Strings, numbers and maps of them: encoding cannot fail.
    encoded.unwrap_or_else(|_| "{}".to_owned())
}

/// The data of an event of type `kind` stored as `text` in [`EVENT_FORMAT`].
fn decode_event(kind: &str, text: &str) -> Result<EventData, StoreError> {
    let data = match kind {
        "run.created" => EventData::RunCreated(Box::new(read::<StoredSnapshot>(text)?.try_into()?)),
        "run.succeeded" => EventData::RunSucceeded(Box::new(read::<StoredSnapshot>(text)?.try_into()?)),
        "run.failed" => EventData::RunFailed(Box::new(read::<StoredSnapshot>(text)?.try_into()?)),
        "run.canceled" => EventData::RunCanceled(Box::new(read::<StoredSnapshot>(text)?.try_into()?)),
        "run.started" => EventData::RunStarted { attempt: read::<StoredStart>(text)?.attempt },
        "run.awaiting_approval" => EventData::RunAwaitingApproval {
            approval_ids: read::<StoredAwaiting>(text)?
                .approval_ids
                .iter()
                .map(|id| id.parse().map_err(|_| malformed("approval id")))
                .collect::<Result<_, _>>()?,
        },
        "run.resumed" => EventData::RunResumed,
        "run.requeued" => EventData::RunRequeued,
        "approval.requested" => EventData::ApprovalRequested(approval(text)?),
        "approval.decided" => EventData::ApprovalDecided(approval(text)?),
        "approval.expiring" => EventData::ApprovalExpiring(approval(text)?),
        "approval.extended" => EventData::ApprovalExtended(approval(text)?),
        "approval.expired" => EventData::ApprovalExpired(approval(text)?),
        "approval.canceled" => EventData::ApprovalCanceled(approval(text)?),
        "output.appended" => EventData::OutputAppended { text: read::<StoredText>(text)?.into() },
        "model.responded" => {
            let reply = read::<StoredReply>(text)?;
            EventData::ModelResponded {
                text: reply.text.into(),
                tool_calls: reply.tool_calls,
                usage: reply.usage.map(Into::into),
            }
        }
        "tool.completed" => {
            let call = read::<StoredToolCall>(text)?;
            EventData::ToolCompleted(Box::new(ToolCompleted {
                tool: call.tool,
                arguments: call.arguments,
                http_status: call.http_status,
                duration_ms: call.duration_ms,
                result: call.result.into(),
                mcp_server: call.mcp_server,
                policy: call.policy.map(StoredPolicyMatch::read).transpose()?,
            }))
        }
        "context.truncated" => {
            let StoredTruncation { dropped_turns, dropped_bytes } = read(text)?;
            EventData::ContextTruncated { dropped_turns, dropped_bytes }
        }
        _ => return Err(StoreError::Defect(format!("stored event: unknown type {kind:?}"))),
    };
    Ok(data)
}

fn malformed(what: &str) -> StoreError {
    StoreError::Defect(format!("stored event: malformed {what}"))
}

fn read<T: DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|_| malformed("data"))
}

fn approval(text: &str) -> Result<Approval, StoreError> {
    Approval::try_from(read::<StoredApproval>(text)?)
}

/// A text cut as events cut texts; `truncated` only when it was.
#[derive(Debug, Serialize, Deserialize)]
struct StoredText {
    text: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

impl From<&EventText> for StoredText {
    fn from(text: &EventText) -> Self {
        StoredText { text: text.text.clone(), truncated: text.truncated }
    }
}

impl From<StoredText> for EventText {
    fn from(text: StoredText) -> Self {
        EventText { text: text.text, truncated: text.truncated }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredStart {
    attempt: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredAwaiting {
    approval_ids: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredReply {
    text: StoredText,
    tool_calls: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<StoredUsage>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredTruncation {
    dropped_turns: u64,
    dropped_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredToolCall {
    tool: String,
    arguments: serde_json::Value,
    http_status: Option<u16>,
    duration_ms: u64,
    result: StoredText,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mcp_server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<StoredPolicyMatch>,
}

/// A [`RunSnapshot`]; times are milliseconds since the Unix epoch.
#[derive(Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    id: String,
    status: String,
    agent: String,
    input: StoredText,
    output: Option<StoredText>,
    error: Option<StoredText>,
    approvals: Vec<StoredSummary>,
    metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_by: Option<String>,
    created_at: i64,
    started_at: Option<i64>,
    completed_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<StoredUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<StoredBudget>,
    /// 32 lower-case hex digits.
    trace_id: String,
    /// Only on a run that continues another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thread: Option<StoredThread>,
}

/// An [`ApprovalSummary`].
#[derive(Debug, Serialize, Deserialize)]
struct StoredSummary {
    id: String,
    kind: String,
    action: StoredText,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arguments_sha256: Option<String>,
    status: String,
    requested_at: i64,
    resolved_at: Option<i64>,
    comment: Option<String>,
    expires_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolved_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<StoredPolicyMatch>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    tool_changed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auto_approves_at: Option<i64>,
    /// A question's schema and answer, as JSON inside the record (as text
    /// they would be escaped once more, up to twice their size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_schema: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<serde_json::Value>,
}

impl From<&RunSnapshot> for StoredSnapshot {
    fn from(run: &RunSnapshot) -> Self {
        StoredSnapshot {
            id: run.id.to_string(),
            status: run.status.as_str().to_owned(),
            agent: run.agent.clone(),
            input: (&run.input).into(),
            output: run.output.as_ref().map(Into::into),
            error: run.error.as_ref().map(Into::into),
            approvals: run.approvals.iter().map(StoredSummary::from).collect(),
            metadata: run.metadata.clone(),
            created_by: run.created_by.map(|key| key.to_string()),
            created_at: run.created_at.millis(),
            started_at: run.started_at.map(millis),
            completed_at: run.completed_at.map(millis),
            usage: run.usage.map(StoredUsage::from),
            budget: StoredBudget::of(run.budget),
            trace_id: format!("{:032x}", run.trace_id),
            thread: run.thread.map(StoredThread::from),
        }
    }
}

impl TryFrom<StoredSnapshot> for RunSnapshot {
    type Error = StoreError;

    fn try_from(stored: StoredSnapshot) -> Result<RunSnapshot, StoreError> {
        Ok(RunSnapshot {
            id: stored.id.parse().map_err(|_| malformed("run id"))?,
            status: RunStatus::parse(&stored.status).ok_or_else(|| malformed("run status"))?,
            agent: stored.agent,
            input: stored.input.into(),
            output: stored.output.map(Into::into),
            error: stored.error.map(Into::into),
            approvals: stored.approvals.into_iter().map(ApprovalSummary::try_from).collect::<Result<_, _>>()?,
            metadata: stored.metadata,
            created_by: stored.created_by.map(|key| key.parse().map_err(|_| malformed("created_by"))).transpose()?,
            created_at: Timestamp::from_millis(stored.created_at),
            started_at: at(stored.started_at),
            completed_at: at(stored.completed_at),
            usage: stored.usage.map(Into::into),
            budget: StoredBudget::read(stored.budget),
            trace_id: u128::from_str_radix(&stored.trace_id, 16).map_err(|_| malformed("trace id"))?,
            thread: stored.thread.map(ThreadLink::try_from).transpose()?,
        })
    }
}

impl From<&ApprovalSummary> for StoredSummary {
    fn from(approval: &ApprovalSummary) -> Self {
        StoredSummary {
            id: approval.id.to_string(),
            kind: approval.kind.as_str().to_owned(),
            action: (&approval.action).into(),
            tool: approval.tool.clone(),
            arguments_sha256: approval.arguments_sha256.clone(),
            status: approval.status.as_str().to_owned(),
            requested_at: approval.requested_at.millis(),
            resolved_at: approval.resolved_at.map(millis),
            comment: approval.comment.clone(),
            expires_at: approval.expires_at.map(millis),
            resolved_by: approval.resolved_by.as_ref().map(ToString::to_string),
            policy: approval.policy.as_ref().map(StoredPolicyMatch::from),
            tool_changed: approval.tool_changed,
            auto_approves_at: approval.auto_approves_at.map(millis),
            input_schema: approval.input_schema.clone(),
            answer: approval.answer.clone(),
        }
    }
}

impl TryFrom<StoredSummary> for ApprovalSummary {
    type Error = StoreError;

    fn try_from(stored: StoredSummary) -> Result<ApprovalSummary, StoreError> {
        Ok(ApprovalSummary {
            id: stored.id.parse().map_err(|_| malformed("approval id"))?,
            kind: ApprovalKind::parse(&stored.kind).ok_or_else(|| malformed("approval kind"))?,
            action: stored.action.into(),
            tool: stored.tool,
            arguments_sha256: stored.arguments_sha256,
            status: ApprovalStatus::parse(&stored.status).ok_or_else(|| malformed("approval status"))?,
            requested_at: Timestamp::from_millis(stored.requested_at),
            resolved_at: at(stored.resolved_at),
            comment: stored.comment,
            expires_at: at(stored.expires_at),
            resolved_by: stored.resolved_by.map(|key| key.parse().map_err(|_| malformed("resolved_by"))).transpose()?,
            policy: stored.policy.map(StoredPolicyMatch::read).transpose()?,
            tool_changed: stored.tool_changed,
            auto_approves_at: at(stored.auto_approves_at),
            input_schema: stored.input_schema,
            answer: stored.answer,
        })
    }
}

#[cfg(test)]
mod tests;
