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
use crate::domain::{
    Approval, ApprovalKind, ApprovalStatus, ApprovalSummary, EventData, EventText, RunSnapshot, RunStatus, ThreadLink,
    Timestamp, ToolCompleted,
};
use crate::views::{Shown, event_data_json};

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
    pub fn written(data: &EventData, format: EventFormat, shown: Shown) -> Self {
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
    pub fn render(&self, kind: &str, shown: Shown) -> Result<Cow<'_, str>, StoreError> {
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
mod tests {
    use super::*;
    use crate::domain::{
        ApprovalId, Effect, ExecutionPolicy, KeyId, Owner, PolicyMatch, ProposedCall, Resolver, RuleMode, Run, RunId,
        RunTrace, Usage,
    };
    use crate::views::event_data_json;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(1_795_303_478_000 + millis)
    }

    fn approval(n: u128, call: bool) -> Approval {
        Approval {
            id: ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
            action: if call { "Call deploy".into() } else { "é".repeat(3_000) },
            call: call.then(|| ProposedCall {
                tool: "deploy".into(),
                arguments: serde_json::json!({"env": "prod", "n": 1e21}),
            }),
            status: ApprovalStatus::Approved,
            requested_at: at(1),
            resolved_at: Some(at(2)),
            comment: Some("ok".into()),
            expires_at: Some(at(3)),
            expiry_warned: true,
            resolved_by: Some(Resolver::Key(KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 9)))),
            edited_arguments: call.then(|| serde_json::json!({"env": "staging"})),
            policy: None,
            input_schema: None,
            answer: None,
            tool_changed: false,
            auto_approves_at: None,
        }
    }

    /// A question a person answered.
    fn question() -> Approval {
        Approval {
            status: ApprovalStatus::Answered,
            input_schema: Some(serde_json::json!({"enum": ["staging", "prod"]})),
            answer: Some(serde_json::json!("prod")),
            ..approval(5, false)
        }
    }

    /// A call a rule decided.
    fn by_policy() -> Approval {
        let policy = PolicyMatch { rule: "small".into(), effect: Effect::Deny, mode: RuleMode::Enforce, version: 3 };
        Approval { resolved_by: Some(Resolver::Policy("small".into())), policy: Some(policy), ..approval(4, true) }
    }

    /// A run with something in every field an event shows.
    fn run() -> Run {
        let id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
        let metadata = [("ticket".to_owned(), "OPS-1".to_owned())].into();
        let mut run = Run::new(
            id,
            Owner::parse("acme").unwrap(),
            "ops".into(),
            "x".repeat(5_000),
            metadata,
            &ExecutionPolicy::default(),
        )
        .created_by(KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 7)))
        .with_trace(RunTrace { trace_id: 0xabc, span_id: 1, parent_span_id: None, sampled: true })
        .with_budget(crate::domain::Budget { max_total_tokens: Some(100), max_tool_calls: None });
        run.status = RunStatus::Succeeded;
        run.output = Some("done".into());
        run.started_at = Some(at(1));
        run.completed_at = Some(at(4));
        run.usage = Some(Usage { input_tokens: 3, output_tokens: 4, total_tokens: 7, tool_calls: 1 });
        run.approvals = vec![approval(2, true), approval(3, false), by_policy(), question()];
        run
    }

    fn every_kind() -> Vec<EventData> {
        let snapshot = || Box::new(RunSnapshot::of(&run()));
        let text = EventText::new(&"y".repeat(5_000));
        vec![
            EventData::RunCreated(snapshot()),
            EventData::RunStarted { attempt: 2 },
            EventData::RunAwaitingApproval { approval_ids: vec![approval(2, true).id, approval(3, false).id] },
            EventData::RunResumed,
            EventData::RunRequeued,
            EventData::RunSucceeded(snapshot()),
            EventData::RunFailed(Box::new(RunSnapshot { error: Some(EventText::new("boom")), ..*snapshot() })),
            EventData::RunCanceled(snapshot()),
            EventData::ApprovalRequested(approval(2, true)),
            EventData::ApprovalDecided(question()),
            EventData::ApprovalExpiring(approval(3, false)),
            EventData::ApprovalExtended(approval(3, false)),
            EventData::ApprovalExpired(approval(3, false)),
            EventData::ApprovalCanceled(by_policy()),
            EventData::OutputAppended { text: text.clone() },
            EventData::ModelResponded {
                text: text.clone(),
                tool_calls: vec!["deploy".into()],
                usage: Some(Usage { input_tokens: 1, output_tokens: 2, total_tokens: 3, tool_calls: 0 }),
            },
            EventData::ToolCompleted(Box::new(ToolCompleted {
                tool: "deploy".into(),
                arguments: serde_json::json!({"env": "prod"}),
                http_status: None,
                duration_ms: 12,
                result: text,
                mcp_server: Some("github".into()),
                policy: Some(PolicyMatch {
                    rule: "watch".into(),
                    effect: crate::domain::Effect::Deny,
                    mode: crate::domain::RuleMode::LogOnly,
                    version: 3,
                }),
            })),
            EventData::ContextTruncated { dropped_turns: 3, dropped_bytes: 12_345 },
        ]
    }

    /// Every event reads back as it was written, and clients get from the
    /// read exactly what its data renders to, whatever the deployment shows.
    #[test]
    fn every_kind_reads_back_and_renders_as_written() {
        let all = every_kind();
        assert_eq!(all.iter().map(EventData::kind).collect::<Vec<_>>(), crate::domain::EVENT_TYPES);
        for data in all {
            let kind = data.kind();
            let body = EventBody::written(&data, EventFormat::Record, Shown::default());
            assert_eq!(body.format(), EVENT_FORMAT);
            assert_eq!(body.decode(kind).unwrap().as_ref(), Some(&data), "{kind}");
            for trace_ids in [false, true] {
                let shown = Shown { trace_ids };
                assert_eq!(body.render(kind, shown).unwrap(), event_data_json(&data, shown), "{kind}");
                // Rendered at write, as a deploy over an older release writes.
                let rendered = EventBody::written(&data, EventFormat::Rendered, shown);
                assert_eq!((rendered.format(), rendered.decode(kind).unwrap()), (RENDERED_FORMAT, None));
                assert_eq!(rendered.render(kind, Shown::default()).unwrap(), event_data_json(&data, shown), "{kind}");
            }
        }
    }

    /// The event that ends a run fits a store's item (DynamoDB's 400 KB)
    /// whatever its texts: 50 approvals of the longest questions and
    /// comments, in control characters (six bytes each in JSON), the
    /// longest input and metadata. A run with few approvals keeps their
    /// texts whole.
    #[test]
    fn the_event_that_ends_a_run_fits_an_item_whatever_its_texts() {
        let control = |chars: usize| "\u{1}".repeat(chars);
        let mut run = run();
        run.input = control(64 * 1024);
        run.output = Some(control(64 * 1024));
        run.metadata = (0..16).map(|key| (format!("{key:0>64}"), control(512))).collect();
        run.approvals = (0..50)
            .map(|n| Approval {
                action: control(crate::domain::MAX_QUESTION_CHARS),
                comment: Some(control(1_000)),
                ..if n % 2 == 0 { question() } else { approval(n, true) }
            })
            .collect();
        let ended = EventData::RunSucceeded(Box::new(RunSnapshot::of(&run)));
        for format in [EventFormat::Record, EventFormat::Rendered] {
            let stored = EventBody::written(&ended, format, Shown { trace_ids: true }).text().len();
            assert!(stored < 300_000, "{stored} bytes");
        }
        let shown: serde_json::Value = serde_json::from_str(&event_data_json(&ended, Shown::default())).unwrap();
        let first = &shown["pending_approvals"][0];
        assert_eq!((shown["truncated"].as_bool(), &first["answer"]), (Some(true), &serde_json::Value::Null));
        assert_eq!(first["action"].as_str().map(str::len), Some(crate::domain::SHORT_APPROVAL_TEXT_BYTES));

        run.approvals.truncate(3);
        let whole: serde_json::Value = serde_json::from_str(&event_data_json(
            &EventData::RunSucceeded(Box::new(RunSnapshot::of(&run))),
            Shown::default(),
        ))
        .unwrap();
        assert_eq!(whole["pending_approvals"][0]["action"].as_str().map(str::len), Some(2_000));
        assert_eq!(whole["pending_approvals"][0]["answer"], "prod");
        assert_eq!(whole["pending_approvals"][0]["comment"].as_str().map(str::len), Some(1_000));
    }

    /// The stored format is this text: changing it must be a new format.
    #[test]
    fn the_stored_format_is_fixed() {
        let data = EventData::RunCanceled(Box::new(RunSnapshot {
            approvals: vec![],
            input: EventText::new("hi"),
            output: None,
            ..RunSnapshot::of(&run())
        }));
        let stored = r#"{"id":"run_01M806T4VB0000000000000001","status":"succeeded","agent":"ops","input":{"text":"hi"},"output":null,"error":null,"approvals":[],"metadata":{"ticket":"OPS-1"},"created_by":"key_01M806T4VB0000000000000007","created_at":1795303478123,"started_at":1795303478001,"completed_at":1795303478004,"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7,"tool_calls":1},"budget":{"max_total_tokens":100},"trace_id":"00000000000000000000000000000abc"}"#;
        assert_eq!(encode_event(&data), stored);
        // A question in a run keeps its schema and answer; a record
        // written before they were kept reads them as none.
        let asked = EventData::RunCanceled(Box::new(RunSnapshot {
            approvals: vec![ApprovalSummary::of(&question())],
            ..RunSnapshot::of(&run())
        }));
        let kept = r#","input_schema":{"enum":["staging","prod"]},"answer":"prod"}"#;
        let stored = encode_event(&asked);
        assert!(stored.contains(kept), "{stored}");
        let before = EventBody::stored(EVENT_FORMAT, stored.replace(kept, "}"));
        let shown = before.render("run.canceled", Shown::default()).unwrap();
        assert!(shown.contains(r#""input_schema":null,"answer":null"#), "{shown}");
        let approval = encode_event(&EventData::ApprovalDecided(approval(2, true)));
        assert_eq!(
            approval,
            r#"{"id":"apr_01M806T4VB0000000000000002","action":"Call deploy","status":"approved","requested_at":1795303478001,"resolved_at":1795303478002,"comment":"ok","expires_at":1795303478003,"expiry_warned":true,"resolved_by":"key_01M806T4VB0000000000000009","tool":"deploy","arguments":"{\"env\":\"prod\",\"n\":1e+21}","edited_arguments":"{\"env\":\"staging\"}"}"#
        );
    }

    #[test]
    fn events_from_before_the_record_are_shown_as_they_were_written() {
        let json = r#"{"text":"old","truncated":false}"#;
        let body = EventBody::stored(RENDERED_FORMAT, json.to_owned());
        assert_eq!(body.render("output.appended", Shown { trace_ids: true }).unwrap(), json);
    }

    #[test]
    fn a_record_that_does_not_read_back_is_a_defect() {
        let cases = [
            (3, "output.appended", r#"{"text":"a"}"#),
            (EVENT_FORMAT, "output.appended", r#"{"txt":"a"}"#),
            (EVENT_FORMAT, "run.paused", "{}"),
            (EVENT_FORMAT, "run.awaiting_approval", r#"{"approval_ids":["nope"]}"#),
            (EVENT_FORMAT, "approval.decided", r#"{"id":"apr_x"}"#),
        ];
        for (format, kind, text) in cases {
            let body = EventBody::stored(format, text.to_owned());
            assert!(matches!(body.render(kind, Shown::default()), Err(StoreError::Defect(_))), "{kind} {text}");
        }
    }
}
