//! A run as both stores keep it: SQLite's JSON body and DynamoDB's item
//! attributes are this record, not the domain's [`Run`]. The field names
//! and encodings here are the stored format; renaming a domain field
//! changes nothing stored, and a record that does not read back as a run is
//! a [`StoreError::Defect`], never a silently different run. A field added
//! later must read as its default from older records (`#[serde(default)]`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StoreError;
use agent_runs_domain::{
    Approval, ApprovalStatus, Budget, Effect, Lease, Owner, PolicyMatch, ProposedCall, RuleMode, Run, RunStatus,
    RunTrace, StoreNote, ThreadLink, Timestamp, Usage, canonical_json,
};

#[derive(Debug, Serialize, Deserialize)]
pub struct StoredRun {
    id: String,
    owner: String,
    status: String,
    agent: String,
    input: String,
    output: Option<String>,
    error: Option<String>,
    approvals: Vec<StoredApproval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_by: Option<String>,
    metadata: BTreeMap<String, String>,
    /// Times are milliseconds since the Unix epoch.
    created_at: i64,
    started_at: Option<i64>,
    completed_at: Option<i64>,
    version: u64,
    due_at: Option<i64>,
    attempts: u32,
    lease: Option<StoredLease>,
    checkpoint: Option<serde_json::Value>,
    #[serde(default)]
    execution_ms: u64,
    #[serde(default)]
    running_since: Option<i64>,
    #[serde(default)]
    usage: Option<StoredUsage>,
    #[serde(default)]
    resends: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count_item: Option<u32>,
    /// Whether a checkpoint was ever kept in an item of its own (DynamoDB);
    /// absent when unknown (written by a release that kept no such note).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checkpoint_item: Option<bool>,
    /// The `seq` of the run's last event; absent before runs had events.
    #[serde(default, skip_serializing_if = "is_zero")]
    event_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<StoredBudget>,
    /// Absent from runs stored before runs had traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace: Option<StoredTrace>,
    /// Only on a run that continues another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thread: Option<StoredThread>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    checkpoint_carried: bool,
}

/// A [`ThreadLink`]: the thread's first run and the run continued.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredThread {
    thread_id: String,
    previous_run_id: String,
}

impl From<ThreadLink> for StoredThread {
    fn from(thread: ThreadLink) -> Self {
        StoredThread { thread_id: thread.thread_id.to_string(), previous_run_id: thread.previous_run_id.to_string() }
    }
}

impl TryFrom<StoredThread> for ThreadLink {
    type Error = StoreError;

    fn try_from(stored: StoredThread) -> Result<ThreadLink, StoreError> {
        Ok(ThreadLink {
            thread_id: stored.thread_id.parse().map_err(|_| malformed("thread_id"))?,
            previous_run_id: stored.previous_run_id.parse().map_err(|_| malformed("previous_run_id"))?,
        })
    }
}

fn is_zero(number: &u64) -> bool {
    *number == 0
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredApproval {
    id: String,
    action: String,
    status: String,
    requested_at: i64,
    resolved_at: Option<i64>,
    comment: Option<String>,
    /// Absent from records made before approvals expired.
    #[serde(default)]
    expires_at: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    expiry_warned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolved_by: Option<String>,
    /// A tool call's tool, and its arguments as canonical JSON text (kept
    /// as text so that no store's number format can change the digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arguments: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edited_arguments: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<StoredPolicyMatch>,
    /// A question's schema and its answer, as canonical JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<String>,
    /// Absent (false) unless the call's MCP tool changed since pinning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    tool_changed: bool,
    /// Absent unless its tool has a veto window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auto_approves_at: Option<i64>,
}

/// The rule an approval names.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredPolicyMatch {
    rule: String,
    effect: String,
    mode: String,
    version: u64,
}

impl From<&PolicyMatch> for StoredPolicyMatch {
    fn from(policy: &PolicyMatch) -> Self {
        StoredPolicyMatch {
            rule: policy.rule.clone(),
            effect: policy.effect.as_str().to_owned(),
            mode: policy.mode.as_str().to_owned(),
            version: policy.version,
        }
    }
}

impl StoredPolicyMatch {
    pub(super) fn read(self) -> Result<PolicyMatch, StoreError> {
        Ok(PolicyMatch {
            effect: Effect::parse(&self.effect).ok_or_else(|| malformed("approval policy effect"))?,
            mode: RuleMode::parse(&self.mode).ok_or_else(|| malformed("approval policy mode"))?,
            rule: self.rule,
            version: self.version,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredLease {
    worker: String,
    expires_at: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredUsage {
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    tool_calls: u64,
}

/// A client's budget for the run; absent when it set none.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_total_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tool_calls: Option<u64>,
}

/// W3C Trace Context ids, as lower-case hex.
#[derive(Debug, Serialize, Deserialize)]
struct StoredTrace {
    id: String,
    span: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    sampled: bool,
}

impl From<RunTrace> for StoredTrace {
    fn from(trace: RunTrace) -> Self {
        StoredTrace {
            id: trace.trace_id_hex(),
            span: format!("{:016x}", trace.span_id),
            parent: trace.parent_span_id.map(|id| format!("{id:016x}")),
            sampled: trace.sampled,
        }
    }
}

impl StoredTrace {
    /// The trace, or `None` for ids that are not valid: the trace only
    /// labels spans and logs, and must never make a run unreadable (the
    /// run then gets the trace derived from its id).
    fn read(&self) -> Option<RunTrace> {
        let span_id = |hex: &str| u64::from_str_radix(hex, 16).ok().filter(|id| *id != 0);
        let trace = RunTrace {
            trace_id: u128::from_str_radix(&self.id, 16).ok().filter(|id| *id != 0)?,
            span_id: span_id(&self.span)?,
            parent_span_id: self.parent.as_deref().and_then(span_id),
            sampled: self.sampled,
        };
        Some(trace)
    }
}

impl From<&Approval> for StoredApproval {
    fn from(approval: &Approval) -> Self {
        StoredApproval {
            id: approval.id.to_string(),
            action: approval.action.clone(),
            status: approval.status.as_str().to_owned(),
            requested_at: approval.requested_at.millis(),
            resolved_at: approval.resolved_at.map(millis),
            comment: approval.comment.clone(),
            expires_at: approval.expires_at.map(millis),
            expiry_warned: approval.expiry_warned,
            resolved_by: approval.resolved_by.as_ref().map(ToString::to_string),
            tool: approval.call.as_ref().map(|call| call.tool.clone()),
            arguments: approval.call.as_ref().map(|call| canonical_json(&call.arguments)),
            edited_arguments: approval.edited_arguments.as_ref().map(canonical_json),
            policy: approval.policy.as_ref().map(StoredPolicyMatch::from),
            input_schema: approval.input_schema.as_ref().map(canonical_json),
            answer: approval.answer.as_ref().map(canonical_json),
            tool_changed: approval.tool_changed,
            auto_approves_at: approval.auto_approves_at.map(millis),
        }
    }
}

impl TryFrom<StoredApproval> for Approval {
    type Error = StoreError;

    fn try_from(approval: StoredApproval) -> Result<Approval, StoreError> {
        let json = |text: String| {
            serde_json::from_str::<serde_json::Value>(&text).map_err(|_| malformed("approval arguments"))
        };
        let call = match (approval.tool, approval.arguments) {
            (Some(tool), Some(arguments)) => Some(ProposedCall { tool, arguments: json(arguments)? }),
            (None, None) => None,
            _ => return Err(malformed("approval call")),
        };
        let policy = approval.policy.map(StoredPolicyMatch::read).transpose()?;
        Ok(Approval {
            id: approval.id.parse().map_err(|_| malformed("approval id"))?,
            action: approval.action,
            call,
            edited_arguments: approval.edited_arguments.map(json).transpose()?,
            status: ApprovalStatus::parse(&approval.status).ok_or_else(|| malformed("approval status"))?,
            requested_at: Timestamp::from_millis(approval.requested_at),
            resolved_at: at(approval.resolved_at),
            comment: approval.comment,
            expires_at: at(approval.expires_at),
            expiry_warned: approval.expiry_warned,
            resolved_by: approval
                .resolved_by
                .map(|key| key.parse().map_err(|_| malformed("approval resolved_by")))
                .transpose()?,
            input_schema: approval.input_schema.map(json).transpose()?,
            answer: approval.answer.map(json).transpose()?,
            tool_changed: approval.tool_changed,
            // An earlier release gave a call an `ask` rule put to a person
            // a veto window: it has none (it expires as any other).
            auto_approves_at: at(approval.auto_approves_at)
                .filter(|_| !policy.as_ref().is_some_and(PolicyMatch::person_must_decide)),
            policy,
        })
    }
}

impl From<Usage> for StoredUsage {
    fn from(usage: Usage) -> Self {
        StoredUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            tool_calls: usage.tool_calls,
        }
    }
}

impl From<StoredUsage> for Usage {
    fn from(usage: StoredUsage) -> Self {
        Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            tool_calls: usage.tool_calls,
        }
    }
}

impl StoredBudget {
    /// Absent for the budget of a run created without one.
    pub(super) fn of(budget: Budget) -> Option<StoredBudget> {
        (budget != Budget::default()).then_some(StoredBudget {
            max_total_tokens: budget.max_total_tokens,
            max_tool_calls: budget.max_tool_calls,
        })
    }

    pub(super) fn read(stored: Option<StoredBudget>) -> Budget {
        stored.map_or_else(Budget::default, |budget| Budget {
            max_total_tokens: budget.max_total_tokens,
            max_tool_calls: budget.max_tool_calls,
        })
    }
}

pub(super) fn millis(at: Timestamp) -> i64 {
    at.millis()
}

impl From<&Run> for StoredRun {
    fn from(run: &Run) -> Self {
        StoredRun {
            id: run.id.to_string(),
            owner: run.owner.to_string(),
            status: run.status.as_str().to_owned(),
            agent: run.agent.clone(),
            input: run.input.clone(),
            output: run.output.clone(),
            error: run.error.clone(),
            approvals: run.approvals.iter().map(StoredApproval::from).collect(),
            created_by: run.created_by.map(|key| key.to_string()),
            metadata: run.metadata.clone(),
            created_at: run.created_at.millis(),
            started_at: run.started_at.map(millis),
            completed_at: run.completed_at.map(millis),
            version: run.version,
            due_at: run.due_at.map(millis),
            attempts: run.attempts,
            lease: run
                .lease
                .as_ref()
                .map(|lease| StoredLease { worker: lease.worker.clone(), expires_at: lease.expires_at.millis() }),
            checkpoint: run.checkpoint.clone(),
            execution_ms: run.execution_ms,
            running_since: run.running_since.map(millis),
            usage: run.usage.map(StoredUsage::from),
            resends: run.resends,
            count_item: run.store_note.count_item,
            checkpoint_item: run.store_note.checkpoint_item,
            event_seq: run.event_seq,
            budget: StoredBudget::of(run.budget),
            trace: run.trace.map(StoredTrace::from),
            thread: run.thread.map(StoredThread::from),
            checkpoint_carried: run.checkpoint_carried,
        }
    }
}

pub(super) fn malformed(what: &str) -> StoreError {
    StoreError::Defect(format!("stored run: malformed {what}"))
}

pub(super) fn at(millis: Option<i64>) -> Option<Timestamp> {
    millis.map(Timestamp::from_millis)
}

impl TryFrom<StoredRun> for Run {
    type Error = StoreError;

    fn try_from(stored: StoredRun) -> Result<Run, StoreError> {
        let approvals = stored.approvals.into_iter().map(Approval::try_from).collect::<Result<_, StoreError>>()?;
        Ok(Run {
            id: stored.id.parse().map_err(|_| malformed("id"))?,
            owner: Owner::parse(&stored.owner).map_err(|_| malformed("owner"))?,
            status: RunStatus::parse(&stored.status).ok_or_else(|| malformed("status"))?,
            agent: stored.agent,
            input: stored.input,
            output: stored.output,
            error: stored.error,
            approvals,
            created_by: stored.created_by.map(|key| key.parse().map_err(|_| malformed("created_by"))).transpose()?,
            metadata: stored.metadata,
            created_at: Timestamp::from_millis(stored.created_at),
            started_at: at(stored.started_at),
            completed_at: at(stored.completed_at),
            version: stored.version,
            due_at: at(stored.due_at),
            attempts: stored.attempts,
            lease: stored
                .lease
                .map(|lease| Lease { worker: lease.worker, expires_at: Timestamp::from_millis(lease.expires_at) }),
            checkpoint: stored.checkpoint,
            checkpoint_carried: stored.checkpoint_carried,
            thread: stored.thread.map(ThreadLink::try_from).transpose()?,
            execution_ms: stored.execution_ms,
            running_since: at(stored.running_since),
            usage: stored.usage.map(Usage::from),
            budget: StoredBudget::read(stored.budget),
            trace: stored.trace.as_ref().and_then(StoredTrace::read),
            resends: stored.resends,
            store_note: StoreNote { count_item: stored.count_item, checkpoint_item: stored.checkpoint_item },
            event_seq: stored.event_seq,
            pending_events: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies as the store wrote them before this record existed (the
    /// domain's `Run` was serialized directly): they must read back, and a
    /// run must be written exactly the same way.
    const EARLIER_BODIES: [&str; 3] = [
        r#"{"id":"run_01KAB0000000000000000000AA","owner":"acme","status":"queued","agent":"ops","input":"do it","output":null,"error":null,"approvals":[{"id":"apr_01KAB0000000000000000000BB","action":"Call the tool","status":"rejected","requested_at":1795303479123,"resolved_at":1795303480123,"comment":"no","expires_at":1795389879123}],"metadata":{"ticket":"OPS-1"},"created_at":1763453173760,"started_at":1795303478123,"completed_at":null,"version":7,"due_at":1795303540123,"attempts":0,"lease":null,"checkpoint":{"messages":[1,"two"],"n":3},"execution_ms":1000,"running_since":null,"usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15},"resends":0}"#,
        r#"{"id":"run_01KAB0000000000000000000AA","owner":"acme","status":"queued","agent":"echo","input":"hi","output":null,"error":null,"approvals":[],"metadata":{},"created_at":1795303478123,"started_at":null,"completed_at":null,"version":0,"due_at":1763453233760,"attempts":0,"lease":null,"checkpoint":null,"execution_ms":0,"running_since":null,"usage":null,"resends":0}"#,
        r#"{"id":"run_01KAB0000000000000000000AA","owner":"acme","status":"running","agent":"echo","input":"hi","output":null,"error":null,"approvals":[],"metadata":{},"created_at":1795303478123,"started_at":1795303478123,"completed_at":null,"version":0,"due_at":1795303508123,"attempts":1,"lease":{"worker":"wrk_2.def","expires_at":1795303508123},"checkpoint":null,"execution_ms":0,"running_since":1795303478123,"usage":null,"resends":0}"#,
    ];

    fn read(body: &str) -> Run {
        Run::try_from(serde_json::from_str::<StoredRun>(body).unwrap()).unwrap()
    }

    #[test]
    fn earlier_records_read_back_and_are_written_the_same_way() {
        for body in EARLIER_BODIES {
            let run = read(body);
            assert_eq!(serde_json::to_string(&StoredRun::from(&run)).unwrap(), body);
        }
        let run = read(EARLIER_BODIES[0]);
        assert_eq!(
            (run.status, run.version, run.approvals[0].status),
            (RunStatus::Queued, 7, ApprovalStatus::Rejected)
        );
        assert_eq!(run.approvals[0].comment.as_deref(), Some("no"));
        assert_eq!(run.usage.map(|usage| usage.total_tokens), Some(15));
        assert_eq!(read(EARLIER_BODIES[2]).lease.unwrap().worker, "wrk_2.def");
    }

    #[test]
    fn records_from_before_later_fields_read_with_their_defaults() {
        let oldest = r#"{"id":"run_01KAB0000000000000000000AA","owner":"acme","status":"awaiting_approval","agent":"echo","input":"hi","output":null,"error":null,"approvals":[{"id":"apr_01KAB0000000000000000000BB","action":"x","status":"pending","requested_at":5,"resolved_at":null,"comment":null}],"metadata":{},"created_at":1,"started_at":2,"completed_at":null,"version":3,"due_at":null,"attempts":1,"lease":null,"checkpoint":null}"#;
        let run = read(oldest);
        assert_eq!((run.execution_ms, run.running_since, run.usage, run.resends), (0, None, None, 0));
        assert_eq!(run.approvals[0].expires_at, None);
    }

    /// An earlier release gave a call an `enforce` `ask` rule put to a
    /// person a veto window; it reads without one (a log_only rule's keeps it).
    #[test]
    fn a_window_on_a_call_an_ask_rule_put_to_a_person_reads_as_none() {
        let stored = |mode: &str| {
            let approval = format!(
                r#"{{"id":"apr_01KAB0000000000000000000BB","action":"x","status":"pending","requested_at":5,"resolved_at":null,"comment":null,"expires_at":900,"auto_approves_at":65,"policy":{{"rule":"r","effect":"ask","mode":"{mode}","version":1}}}}"#
            );
            read(&format!(
                r#"{{"id":"run_01KAB0000000000000000000AA","owner":"acme","status":"awaiting_approval","agent":"echo","input":"hi","output":null,"error":null,"approvals":[{approval}],"metadata":{{}},"created_at":1,"started_at":2,"completed_at":null,"version":3,"due_at":null,"attempts":1,"lease":null,"checkpoint":null}}"#
            ))
        };
        assert_eq!(stored("enforce").approvals[0].auto_approves_at, None);
        assert_eq!(stored("log_only").approvals[0].auto_approves_at, Some(Timestamp::from_millis(65)));
    }

    #[test]
    fn a_runs_trace_reads_back_and_an_older_run_derives_one() {
        let mut run = read(EARLIER_BODIES[1]);
        assert_eq!(run.trace, None);
        assert_eq!(run.trace(), RunTrace::derived(run.id));
        let trace = RunTrace { trace_id: 0x4bf9 << 64 | 7, span_id: 0xff, parent_span_id: Some(1), sampled: false };
        run.trace = Some(trace);
        let body = serde_json::to_string(&StoredRun::from(&run)).unwrap();
        assert!(body.contains(r#""trace":{"id":"0000000000004bf90000000000000007","span":"00000000000000ff","parent":"0000000000000001","sampled":false}"#), "{body}");
        assert_eq!(read(&body).trace, Some(trace));
        // Ids that are not valid leave the run readable, with its derived trace.
        for (valid, invalid) in [("00000000000000ff", "not hex"), ("00000000000000ff", "0000000000000000")] {
            let run = read(&body.replace(valid, invalid));
            assert_eq!((run.trace, run.trace()), (None, RunTrace::derived(run.id)));
        }
    }

    #[test]
    fn a_record_that_is_not_a_run_is_a_defect_not_a_different_run() {
        for (from, to) in [("\"queued\"", "\"paused\""), ("run_01KAB", "xyz_01KAB"), ("\"acme\"", "\"a b\"")] {
            let body = EARLIER_BODIES[1].replacen(from, to, 1);
            let stored: StoredRun = serde_json::from_str(&body).unwrap();
            assert!(matches!(Run::try_from(stored), Err(StoreError::Defect(_))), "{to}");
        }
    }
}
