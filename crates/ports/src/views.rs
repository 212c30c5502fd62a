//! The wire form of runs and events: every key always present, unknown
//! values `null`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use agent_runs_domain::{
    Approval, ApprovalSummary, Budget, DeliveryAttempt, EventData, EventId, EventText, InboxEntry, PolicyMatch, Run,
    RunId, RunSnapshot, Timestamp, Usage, WebhookEndpoint, canonical_json,
};
/// What a deployment shows of a run beyond the contract's keys, decided
/// once by the composition root (from the configuration) and passed to
/// whatever renders runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtraFields {
    /// `trace_id`: when the deployment exports traces.
    pub trace_ids: bool,
}

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
    /// The conversation's first run (the run's own id when it continues
    /// none), and the run it continues.
    thread_id: String,
    previous_run_id: Option<String>,
    /// The key that created the run (`null` for runs from before).
    created_by: Option<String>,
    created_at: String,
    started_at: Option<String>,
    completed_at: Option<String>,
    /// An addition to the contract's keys: present only once the agent's
    /// model has reported token usage, so other runs show exactly the
    /// contract's keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    /// Also an addition: present only on runs created with a `budget`.
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<Budget>,
    /// Also an addition, present when the deployment exports traces: the
    /// run's OpenTelemetry trace (32 hex digits), so that other
    /// deployments show exactly the contract's keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
}

#[derive(Serialize)]
pub struct ApprovalView<'a> {
    id: String,
    kind: &'static str,
    action: &'a str,
    tool: Option<&'a str>,
    /// As the text the digest covers (RFC 8785), so every client reads the
    /// very numbers and keys the digest and the tool see.
    arguments: Option<Box<RawValue>>,
    arguments_sha256: Option<String>,
    status: &'static str,
    requested_at: String,
    resolved_at: Option<String>,
    comment: Option<&'a str>,
    expires_at: Option<String>,
    /// The key that decided it, or `policy:<rule id>`.
    resolved_by: Option<String>,
    edited_arguments: Option<Box<RawValue>>,
    /// The policy's rule that decided it (or would have).
    policy: Option<PolicyView<'a>>,
    /// A question's schema, and its answer once given (canonical JSON).
    input_schema: Option<Box<RawValue>>,
    answer: Option<Box<RawValue>>,
    /// The call's MCP tool is new or changed since its server was pinned.
    tool_changed: bool,
    /// When a pending approval is approved by `timeout` (a veto window).
    auto_approves_at: Option<String>,
    /// Only in `approval.decided`: approve, edit, reject, answer or timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<&'static str>,
}

#[derive(Serialize)]
pub struct PolicyView<'a> {
    rule: &'a str,
    effect: &'static str,
    mode: &'static str,
    version: u64,
}

impl<'a> From<&'a PolicyMatch> for PolicyView<'a> {
    fn from(policy: &'a PolicyMatch) -> Self {
        PolicyView {
            rule: &policy.rule,
            effect: policy.effect.as_str(),
            mode: policy.mode.as_str(),
            version: policy.version,
        }
    }
}

fn canonical(value: &serde_json::Value) -> Box<RawValue> {
    RawValue::from_string(canonical_json(value)).expect("canonical JSON is JSON")
}

fn rfc3339(at: Option<Timestamp>) -> Option<String> {
    at.map(Timestamp::to_rfc3339)
}

/// An [`ApprovalView`] of `$approval`, an [`Approval`] or an event's
/// [`ApprovalSummary`]: the fields the two hold alike (by the same names)
/// are read here, the others given as `field: value`.
macro_rules! approval_view {
    ($approval:expr, { $($field:ident: $value:expr),* $(,)? }) => {
        ApprovalView {
            $($field: $value,)*
            id: $approval.id.to_string(),
            status: $approval.status.as_str(),
            requested_at: $approval.requested_at.to_rfc3339(),
            resolved_at: rfc3339($approval.resolved_at),
            comment: $approval.comment.as_deref(),
            expires_at: rfc3339($approval.expires_at),
            resolved_by: $approval.resolved_by.as_ref().map(ToString::to_string),
            policy: $approval.policy.as_ref().map(PolicyView::from),
            input_schema: $approval.input_schema.as_ref().map(canonical),
            answer: $approval.answer.as_ref().map(canonical),
            tool_changed: $approval.tool_changed,
            auto_approves_at: rfc3339($approval.auto_approves_at),
            decision: None,
        }
    };
}

impl<'a> From<&'a Approval> for ApprovalView<'a> {
    fn from(approval: &'a Approval) -> Self {
        approval_view!(approval, {
            kind: approval.kind().as_str(),
            action: &approval.action,
            tool: approval.call.as_ref().map(|call| call.tool.as_str()),
            arguments: approval.call.as_ref().map(|call| canonical(&call.arguments)),
            arguments_sha256: approval.arguments_sha256(),
            edited_arguments: approval.edited_arguments.as_ref().map(canonical),
        })
    }
}

/// An approval inside a run's event: a call named by its digest, its
/// arguments left to its own events.
impl<'a> From<&'a ApprovalSummary> for ApprovalView<'a> {
    fn from(approval: &'a ApprovalSummary) -> Self {
        approval_view!(approval, {
            kind: approval.kind.as_str(),
            action: &approval.action.text,
            tool: approval.tool.as_deref(),
            arguments: None,
            arguments_sha256: approval.arguments_sha256.clone(),
            edited_arguments: None,
        })
    }
}

impl<'a> RunView<'a> {
    pub fn new(run: &'a Run, shown: ExtraFields) -> Self {
        RunView {
            id: run.id.to_string(),
            status: run.status.as_str(),
            agent: &run.agent,
            input: &run.input,
            output: run.output.as_deref(),
            error: run.error.as_deref(),
            pending_approvals: run.approvals.iter().map(ApprovalView::from).collect(),
            metadata: &run.metadata,
            thread_id: run.thread_id().to_string(),
            previous_run_id: run.previous_run_id().map(|id| id.to_string()),
            created_by: run.created_by.map(|key| key.to_string()),
            created_at: run.created_at.to_rfc3339(),
            started_at: rfc3339(run.started_at),
            completed_at: rfc3339(run.completed_at),
            usage: run.usage,
            budget: (run.budget != Budget::default()).then_some(run.budget),
            trace_id: shown.trace_ids.then(|| run.trace().trace_id_hex()),
        }
    }
}

/// A webhook endpoint; its secret only in the answers that make one.
#[derive(Serialize)]
pub struct WebhookView<'a> {
    pub id: String,
    pub url: &'a str,
    pub events: Vec<String>,
    pub description: Option<&'a str>,
    pub status: &'static str,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl<'a> From<&'a WebhookEndpoint> for WebhookView<'a> {
    fn from(endpoint: &'a WebhookEndpoint) -> Self {
        WebhookView {
            id: endpoint.id.to_string(),
            url: &endpoint.url,
            events: endpoint.events.names(),
            description: endpoint.description.as_deref(),
            status: endpoint.status.as_str(),
            created_at: endpoint.created_at.to_rfc3339(),
            secret: None,
        }
    }
}

impl<'a> WebhookView<'a> {
    pub fn with_secret(endpoint: &'a WebhookEndpoint) -> Self {
        WebhookView { secret: Some(endpoint.secret.expose()), ..WebhookView::from(endpoint) }
    }
}

/// What a delete answers.
#[derive(Serialize)]
pub struct DeletedView {
    pub id: String,
    pub deleted: bool,
}

/// One delivery attempt.
#[derive(Serialize)]
pub struct DeliveryAttemptView<'a> {
    pub id: String,
    pub event_id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub attempt: u32,
    pub http_status: Option<u16>,
    pub error: Option<&'a str>,
    pub duration_ms: u64,
    pub at: String,
}

impl<'a> From<&'a DeliveryAttempt> for DeliveryAttemptView<'a> {
    fn from(attempt: &'a DeliveryAttempt) -> Self {
        DeliveryAttemptView {
            id: attempt.id.to_string(),
            event_id: &attempt.event_id,
            kind: &attempt.event_type,
            attempt: attempt.attempt,
            http_status: attempt.http_status,
            error: attempt.error.as_deref(),
            duration_ms: attempt.duration_ms,
            at: attempt.at.to_rfc3339(),
        }
    }
}

/// The run's JSON as clients see it, ready to be spliced into a page.
pub fn run_json(run: &Run, shown: ExtraFields) -> Result<std::sync::Arc<str>, serde_json::Error> {
    serde_json::to_string(&RunView::new(run, shown)).map(Into::into)
}

/// A page of a list: `{"data", "next_cursor"}`.
#[derive(Serialize)]
pub struct PageView<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

/// An approval of the inbox: the approval and what it shows of its run.
#[derive(Serialize)]
pub struct InboxEntryView<'a> {
    #[serde(flatten)]
    approval: ApprovalView<'a>,
    run_id: String,
    agent: &'a str,
    run_status: &'static str,
}

impl<'a> From<&'a InboxEntry> for InboxEntryView<'a> {
    fn from(entry: &'a InboxEntry) -> Self {
        InboxEntryView {
            approval: ApprovalView::from(&entry.approval),
            run_id: entry.run_id.to_string(),
            agent: &entry.agent,
            run_status: entry.run_status.as_str(),
        }
    }
}

/// The `data` of an event, as JSON: what the store keeps and clients get.
pub fn event_data_json(data: &EventData, shown: ExtraFields) -> String {
    let encoded = match data {
        EventData::RunCreated(run)
        | EventData::RunSucceeded(run)
        | EventData::RunFailed(run)
        | EventData::RunCanceled(run) => run_in_event(run, shown),
        EventData::RunStarted { attempt } => serde_json::to_string(&serde_json::json!({ "attempt": attempt })),
        EventData::RunAwaitingApproval { approval_ids } => {
            serde_json::to_string(&serde_json::json!({ "approval_ids": approval_ids }))
        }
        EventData::RunResumed | EventData::RunRequeued => Ok("{}".to_owned()),
        EventData::ApprovalDecided(approval) => approval_in_event(approval, approval.decision()),
        EventData::ApprovalRequested(approval)
        | EventData::ApprovalExpiring(approval)
        | EventData::ApprovalExtended(approval)
        | EventData::ApprovalExpired(approval)
        | EventData::ApprovalCanceled(approval) => approval_in_event(approval, None),
        EventData::OutputAppended { text } => {
            serde_json::to_string(&serde_json::json!({ "text": text.text, "truncated": text.truncated }))
        }
        EventData::ModelResponded { text, tool_calls, usage } => serde_json::to_string(&serde_json::json!({
            "text": text.text,
            "truncated": text.truncated,
            "tool_calls": tool_calls,
            // The tokens of this call (a run's usage also counts its tool calls).
            "usage": usage.map(|usage| serde_json::json!({
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
            })),
        })),
        EventData::ToolCompleted(call) => {
            let mut data = serde_json::json!({
                "tool": call.tool,
                "arguments": call.arguments,
                "http_status": call.http_status,
                "duration_ms": call.duration_ms,
                "result": call.result.text,
                "truncated": call.result.truncated,
            });
            // An MCP tool's call names its server (an HTTP tool's shows as before).
            if let Some(server) = &call.mcp_server {
                data["mcp_server"] = server.as_str().into();
            }
            // A `log_only` rule that matched a call no one was asked about.
            data["policy"] = serde_json::json!(call.policy.as_ref().map(PolicyView::from));
            serde_json::to_string(&data)
        }
        EventData::ContextTruncated { dropped_turns, dropped_bytes } => serde_json::to_string(
            &serde_json::json!({ "dropped_turns": dropped_turns, "dropped_bytes": dropped_bytes }),
        ),
    };
    // Strings, numbers and maps of them: encoding cannot fail.
    encoded.unwrap_or_else(|_| "{}".to_owned())
}

/// Adds `"truncated": true` to an object's JSON when a text in it was cut.
fn flagged(view: impl Serialize, truncated: bool) -> serde_json::Result<String> {
    if !truncated {
        return serde_json::to_string(&view);
    }
    let mut value = serde_json::to_value(view)?;
    value["truncated"] = true.into();
    serde_json::to_string(&value)
}

/// The run in an event, as its snapshot keeps it.
fn run_in_event(run: &RunSnapshot, shown: ExtraFields) -> serde_json::Result<String> {
    let view = RunView {
        id: run.id.to_string(),
        status: run.status.as_str(),
        agent: &run.agent,
        input: &run.input.text,
        output: run.output.as_ref().map(|text| text.text.as_str()),
        error: run.error.as_ref().map(|text| text.text.as_str()),
        pending_approvals: run.approvals.iter().map(ApprovalView::from).collect(),
        metadata: &run.metadata,
        thread_id: run.thread.map_or(run.id, |thread| thread.thread_id).to_string(),
        previous_run_id: run.thread.map(|thread| thread.previous_run_id.to_string()),
        created_by: run.created_by.map(|key| key.to_string()),
        created_at: run.created_at.to_rfc3339(),
        started_at: rfc3339(run.started_at),
        completed_at: rfc3339(run.completed_at),
        usage: run.usage,
        budget: (run.budget != Budget::default()).then_some(run.budget),
        trace_id: shown.trace_ids.then(|| format!("{:032x}", run.trace_id)),
    };
    flagged(view, run.truncated())
}

fn approval_in_event(approval: &Approval, decision: Option<&'static str>) -> serde_json::Result<String> {
    let action = EventText::new(&approval.action);
    let mut view = ApprovalView::from(approval);
    view.action = &action.text;
    view.decision = decision;
    flagged(view, action.truncated)
}

/// An event as clients get it; `data` is spliced in as rendered.
#[derive(Serialize)]
pub struct EventView<'a> {
    pub id: String,
    pub seq: u64,
    pub run_id: String,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub created_at: String,
    pub data: Box<RawValue>,
}

impl<'a> EventView<'a> {
    /// The event `seq` of the run as clients see it, from its type, time
    /// and rendered data; fails only when the data is not JSON.
    pub fn of(run_id: RunId, seq: u64, kind: &'a str, at: Timestamp, data: &str) -> Result<Self, serde_json::Error> {
        Ok(EventView {
            id: EventId::of_event(run_id, seq, at).to_string(),
            seq,
            run_id: run_id.to_string(),
            kind,
            created_at: at.to_rfc3339(),
            data: serde_json::from_str(data)?,
        })
    }
}

#[derive(Serialize)]
pub struct EventPageView<'a> {
    pub data: Vec<EventView<'a>>,
    pub next_after: u64,
    pub has_more: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_runs_domain::{ExecutionPolicy, Owner};

    /// `trace_id` is shown exactly when the composition root says so, in a
    /// run's JSON and in the run inside its events alike.
    #[test]
    fn a_run_shows_its_trace_id_only_where_the_deployment_shows_it() {
        let id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
        let owner = Owner::parse("acme").unwrap();
        let run = Run::new(id, owner, "echo".into(), "hi".into(), BTreeMap::new(), &ExecutionPolicy::default());
        let trace = run.trace().trace_id_hex();
        for trace_ids in [false, true] {
            let shown = ExtraFields { trace_ids };
            let view: serde_json::Value = serde_json::from_str(&run_json(&run, shown).unwrap()).unwrap();
            let event = event_data_json(&EventData::RunCreated(Box::new(RunSnapshot::of(&run))), shown);
            let event: serde_json::Value = serde_json::from_str(&event).unwrap();
            for json in [&view, &event] {
                assert_eq!(json.get("trace_id").and_then(|id| id.as_str()), trace_ids.then_some(trace.as_str()));
            }
        }
    }
}
