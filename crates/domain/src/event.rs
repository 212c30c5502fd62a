//! A run's events: the append-only log of what happened to it. Transitions
//! record the events of the change they make (`Run::record`); the store
//! writes them in the same write as the run, numbering them from the run's
//! count, so the log holds exactly the changes that were made.

use std::collections::BTreeMap;

use crate::approval::{Approval, ApprovalKind, ApprovalStatus, Resolver, canonical_json};
use crate::ids::{ApprovalId, EventId, KeyId, RunId};
use crate::policy::PolicyMatch;
use crate::run_values::Budget;
use crate::run_values::{RunStatus, ThreadLink, Usage};
use crate::time::Timestamp;

/// Texts in events (a `say` line, a model's reply, a tool's result) are cut
/// to this many bytes, on a character boundary, and flagged.
pub const EVENT_TEXT_BYTES: usize = 4 * 1024;

/// A run in an event keeps its approvals' texts (actions cut as event
/// texts, comments, questions' schemas and answers) while together, as
/// JSON, they take at most this; past it every approval keeps its action
/// and comment cut to [`SHORT_APPROVAL_TEXT_BYTES`] and no schema or
/// answer, flagged. So the event that ends a run always fits a store's
/// item (DynamoDB's 400 KB), whatever texts its 50 approvals had.
pub const SNAPSHOT_APPROVAL_TEXT_BYTES: usize = 128 * 1024;
pub const SHORT_APPROVAL_TEXT_BYTES: usize = 128;

/// A text as an event keeps it: at most [`EVENT_TEXT_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventText {
    pub text: String,
    pub truncated: bool,
}

impl EventText {
    pub fn new(text: &str) -> Self {
        Self::cut(text, EVENT_TEXT_BYTES)
    }

    /// `text` cut to at most `bytes`, on a character boundary.
    fn cut(text: &str, bytes: usize) -> Self {
        if text.len() <= bytes {
            return EventText { text: text.to_owned(), truncated: false };
        }
        let end = (0..=bytes).rev().find(|at| text.is_char_boundary(*at)).unwrap_or(0);
        EventText { text: text[..end].to_owned(), truncated: true }
    }
}

/// The bytes `text` takes inside a JSON string, escapes counted (a control
/// character takes six).
fn json_text_bytes(text: &str) -> usize {
    text.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

/// Every event type a run's log can hold.
pub const EVENT_TYPES: [&str; 18] = [
    "run.created",
    "run.started",
    "run.awaiting_approval",
    "run.resumed",
    "run.requeued",
    "run.succeeded",
    "run.failed",
    "run.canceled",
    "approval.requested",
    "approval.decided",
    "approval.expiring",
    "approval.extended",
    "approval.expired",
    "approval.canceled",
    "output.appended",
    "model.responded",
    "tool.completed",
    "context.truncated",
];

/// What an event says, by type (`EventData::kind` names it on the wire).
#[derive(Clone, Debug, PartialEq)]
pub enum EventData {
    RunCreated(Box<RunSnapshot>),
    RunStarted {
        attempt: u32,
    },
    RunAwaitingApproval {
        approval_ids: Vec<ApprovalId>,
    },
    RunResumed,
    /// A worker handed the run back to the queue (it was stopping).
    RunRequeued,
    RunSucceeded(Box<RunSnapshot>),
    RunFailed(Box<RunSnapshot>),
    RunCanceled(Box<RunSnapshot>),
    ApprovalRequested(Approval),
    ApprovalDecided(Approval),
    ApprovalExpiring(Approval),
    /// A person moved its expiry later.
    ApprovalExtended(Approval),
    ApprovalExpired(Approval),
    ApprovalCanceled(Approval),
    OutputAppended {
        text: EventText,
    },
    ModelResponded {
        text: EventText,
        tool_calls: Vec<String>,
        usage: Option<Usage>,
    },
    ToolCompleted(Box<ToolCompleted>),
    /// The conversation the run continues did not fit whole: its oldest
    /// turns were left out of what the model sees.
    ContextTruncated {
        dropped_turns: u64,
        dropped_bytes: u64,
    },
}

/// A run as its events show it: the keys clients see of a run, its texts
/// cut as every text in an event is and its approvals named by their
/// digest (their arguments are in their own events), so that an event
/// stays small whatever the run holds.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSnapshot {
    pub id: RunId,
    pub status: RunStatus,
    pub agent: String,
    pub input: EventText,
    pub output: Option<EventText>,
    pub error: Option<EventText>,
    pub approvals: Vec<ApprovalSummary>,
    pub metadata: BTreeMap<String, String>,
    pub created_by: Option<KeyId>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub usage: Option<Usage>,
    pub budget: Budget,
    /// The conversation the run continues (none: its own thread).
    pub thread: Option<ThreadLink>,
    /// The run's trace id, shown where the deployment shows traces.
    pub trace_id: u128,
}

/// An approval inside a [`RunSnapshot`]: everything but a call's arguments
/// (a question's schema and answer are kept: what a person was asked and
/// said is the run's as it ended).
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalSummary {
    pub id: ApprovalId,
    pub kind: ApprovalKind,
    pub action: EventText,
    pub tool: Option<String>,
    pub arguments_sha256: Option<String>,
    pub status: ApprovalStatus,
    pub requested_at: Timestamp,
    pub resolved_at: Option<Timestamp>,
    pub comment: Option<String>,
    pub expires_at: Option<Timestamp>,
    pub resolved_by: Option<Resolver>,
    pub policy: Option<PolicyMatch>,
    pub tool_changed: bool,
    pub auto_approves_at: Option<Timestamp>,
    pub input_schema: Option<serde_json::Value>,
    pub answer: Option<serde_json::Value>,
}

impl ApprovalSummary {
    /// The approvals of a run, shortened together past
    /// [`SNAPSHOT_APPROVAL_TEXT_BYTES`].
    pub(crate) fn all_of(approvals: &[Approval]) -> Vec<Self> {
        let mut summaries: Vec<Self> = approvals.iter().map(Self::of).collect();
        if summaries.iter().map(Self::text_bytes).sum::<usize>() > SNAPSHOT_APPROVAL_TEXT_BYTES {
            summaries.iter_mut().for_each(Self::shorten);
        }
        summaries
    }

    /// What its texts take as JSON.
    fn text_bytes(&self) -> usize {
        let json = |value: &serde_json::Value| canonical_json(value).len();
        json_text_bytes(&self.action.text)
            + self.comment.as_deref().map_or(0, json_text_bytes)
            + self.input_schema.as_ref().map_or(0, json)
            + self.answer.as_ref().map_or(0, json)
    }

    /// Its action and comment cut short, no schema or answer: flagged as
    /// cut whether or not the action itself was longer.
    fn shorten(&mut self) {
        self.action = EventText { truncated: true, ..EventText::cut(&self.action.text, SHORT_APPROVAL_TEXT_BYTES) };
        self.comment = self.comment.as_deref().map(|comment| EventText::cut(comment, SHORT_APPROVAL_TEXT_BYTES).text);
        self.input_schema = None;
        self.answer = None;
    }

    pub fn of(approval: &Approval) -> Self {
        ApprovalSummary {
            id: approval.id,
            kind: approval.kind(),
            action: EventText::new(&approval.action),
            tool: approval.call.as_ref().map(|call| call.tool.clone()),
            arguments_sha256: approval.arguments_sha256(),
            status: approval.status,
            requested_at: approval.requested_at,
            resolved_at: approval.resolved_at,
            comment: approval.comment.clone(),
            expires_at: approval.expires_at,
            resolved_by: approval.resolved_by.clone(),
            policy: approval.policy.clone(),
            tool_changed: approval.tool_changed,
            auto_approves_at: approval.auto_approves_at,
            input_schema: approval.input_schema.clone(),
            answer: approval.answer.clone(),
        }
    }
}

/// An HTTP tool call that ended, with or without an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCompleted {
    pub tool: String,
    pub arguments: serde_json::Value,
    /// `None` when no HTTP answer came (refused, timed out, unreachable).
    pub http_status: Option<u16>,
    pub duration_ms: u64,
    pub result: EventText,
    /// The MCP server of an MCP tool (whose `tool` is `<server>__<name>`).
    pub mcp_server: Option<String>,
    /// For a call made with no approval: the first matching `log_only`
    /// rule, with what it would have done.
    pub policy: Option<PolicyMatch>,
}

impl EventData {
    pub fn kind(&self) -> &'static str {
        match self {
            EventData::RunCreated(_) => "run.created",
            EventData::RunStarted { .. } => "run.started",
            EventData::RunAwaitingApproval { .. } => "run.awaiting_approval",
            EventData::RunResumed => "run.resumed",
            EventData::RunRequeued => "run.requeued",
            EventData::RunSucceeded(_) => "run.succeeded",
            EventData::RunFailed(_) => "run.failed",
            EventData::RunCanceled(_) => "run.canceled",
            EventData::ApprovalRequested(_) => "approval.requested",
            EventData::ApprovalDecided(_) => "approval.decided",
            EventData::ApprovalExpiring(_) => "approval.expiring",
            EventData::ApprovalExtended(_) => "approval.extended",
            EventData::ApprovalExpired(_) => "approval.expired",
            EventData::ApprovalCanceled(_) => "approval.canceled",
            EventData::OutputAppended { .. } => "output.appended",
            EventData::ModelResponded { .. } => "model.responded",
            EventData::ToolCompleted(_) => "tool.completed",
            EventData::ContextTruncated { .. } => "context.truncated",
        }
    }

    /// `output.appended` for a text the agent produced.
    pub fn output(text: &str) -> Self {
        EventData::OutputAppended { text: EventText::new(text) }
    }
}

/// An event not yet written: the store numbers it when it writes the run.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub at: Timestamp,
    pub data: EventData,
}

/// An event with its place in the run's log.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub run_id: RunId,
    /// From 1, one more for every event of the run.
    pub seq: u64,
    pub at: Timestamp,
    pub data: EventData,
}

impl Event {
    pub fn id(&self) -> EventId {
        EventId::of_event(self.run_id, self.seq, self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Run;

    #[test]
    fn every_kind_is_listed() {
        let approval = Approval {
            id: ApprovalId::from_ulid(ulid::Ulid::nil()),
            action: String::new(),
            call: None,
            status: ApprovalStatus::Pending,
            requested_at: Timestamp::from_millis(0),
            resolved_at: None,
            comment: None,
            expires_at: None,
            expiry_warned: false,
            resolved_by: None,
            edited_arguments: None,
            policy: None,
            input_schema: None,
            answer: None,
            tool_changed: false,
            auto_approves_at: None,
        };
        let text = EventText::new("");
        let run = || {
            let policy = crate::run::ExecutionPolicy::default();
            Box::new(RunSnapshot::of(&Run::new(
                RunId::from_ulid(ulid::Ulid::nil()),
                crate::ids::Owner::parse("o").unwrap(),
                String::new(),
                String::new(),
                Default::default(),
                &policy,
            )))
        };
        let all = [
            EventData::RunCreated(run()),
            EventData::RunStarted { attempt: 1 },
            EventData::RunAwaitingApproval { approval_ids: vec![] },
            EventData::RunResumed,
            EventData::RunRequeued,
            EventData::RunSucceeded(run()),
            EventData::RunFailed(run()),
            EventData::RunCanceled(run()),
            EventData::ApprovalRequested(approval.clone()),
            EventData::ApprovalDecided(approval.clone()),
            EventData::ApprovalExpiring(approval.clone()),
            EventData::ApprovalExtended(approval.clone()),
            EventData::ApprovalExpired(approval.clone()),
            EventData::ApprovalCanceled(approval),
            EventData::OutputAppended { text: text.clone() },
            EventData::ModelResponded { text: text.clone(), tool_calls: vec![], usage: None },
            EventData::ToolCompleted(Box::new(ToolCompleted {
                tool: String::new(),
                arguments: serde_json::Value::Null,
                http_status: None,
                duration_ms: 0,
                result: text,
                mcp_server: None,
                policy: None,
            })),
            EventData::ContextTruncated { dropped_turns: 1, dropped_bytes: 2 },
        ];
        let kinds: Vec<&str> = all.iter().map(EventData::kind).collect();
        assert_eq!(kinds, EVENT_TYPES);
    }

    #[test]
    fn texts_are_cut_on_a_character_boundary_and_flagged() {
        assert_eq!(EventText::new("short"), EventText { text: "short".into(), truncated: false });
        let exact = "a".repeat(EVENT_TEXT_BYTES);
        assert!(!EventText::new(&exact).truncated);
        // A two-byte character straddles the limit: it is left out whole.
        let straddling = format!("{}é", "a".repeat(EVENT_TEXT_BYTES - 1));
        let cut = EventText::new(&straddling);
        assert_eq!((cut.text.len(), cut.truncated), (EVENT_TEXT_BYTES - 1, true));
    }

    #[test]
    fn event_ids_are_stable_distinct_and_carry_the_time() {
        let run_id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 42));
        let at = Timestamp::from_millis(1_795_303_479_000);
        assert_eq!(EventId::of_event(run_id, 1, at), EventId::of_event(run_id, 1, at));
        assert_ne!(EventId::of_event(run_id, 1, at), EventId::of_event(run_id, 2, at));
        assert_eq!(EventId::of_event(run_id, 7, at).timestamp(), at);
        let shown = EventId::of_event(run_id, 1, at).to_string();
        assert!(shown.starts_with("evt_") && shown.len() == 30, "{shown}");
        assert_eq!(shown.parse::<EventId>().unwrap(), EventId::of_event(run_id, 1, at));
    }
}
