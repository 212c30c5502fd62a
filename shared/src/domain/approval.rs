//! Approvals: what a run asks a human, the exact call it would make, and
//! the decision that binds to it.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{ApprovalId, InboxPosition, KeyId, Run, RunId, RunStatus, Timestamp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Canceled,
    Expired,
}

impl ApprovalStatus {
    pub const ALL: [ApprovalStatus; 5] = [
        ApprovalStatus::Pending,
        ApprovalStatus::Approved,
        ApprovalStatus::Rejected,
        ApprovalStatus::Canceled,
        ApprovalStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Canceled => "canceled",
            ApprovalStatus::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<ApprovalStatus> {
        ApprovalStatus::ALL.into_iter().find(|status| status.as_str() == text)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalKind {
    /// A line of the script agent: words only.
    Action,
    /// A call of a defined agent's tool, with its arguments.
    ToolCall,
}

impl ApprovalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Action => "action",
            ApprovalKind::ToolCall => "tool_call",
        }
    }
}

/// The longest arguments (as canonical JSON) a call put to a human may
/// have, proposed or edited: they are kept with the run, shown in its
/// views and carried by its events.
pub const MAX_APPROVAL_ARGUMENTS_BYTES: usize = 8 * 1024;

/// The most arguments (proposed and edited, as canonical JSON) one run's
/// approvals may hold in all: the run item keeps every approval, and must
/// stay well inside DynamoDB's 400 KB item limit.
pub const MAX_APPROVAL_ARGUMENTS_PER_RUN: usize = 64 * 1024;

/// The bytes of arguments (proposed and edited) these approvals hold.
pub fn approval_arguments_bytes(approvals: &[Approval]) -> usize {
    approvals
        .iter()
        .flat_map(|approval| [approval.call.as_ref().map(|call| &call.arguments), approval.edited_arguments.as_ref()])
        .flatten()
        .map(|arguments| canonical_json(arguments).len())
        .sum()
}

/// A tool call put to a human: the tool and the arguments the model
/// proposed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProposedCall {
    pub tool: String,
    pub arguments: Value,
}

/// What an agent asks a human to decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// In plain words, what approving will do.
    pub action: String,
    /// The exact call, when approving makes one.
    pub call: Option<ProposedCall>,
}

impl ApprovalRequest {
    pub fn action(action: impl Into<String>) -> Self {
        ApprovalRequest { action: action.into(), call: None }
    }
}

impl From<&str> for ApprovalRequest {
    fn from(action: &str) -> Self {
        ApprovalRequest::action(action)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
    /// Approve, with these arguments in place of the proposed ones.
    Edit(Value),
}

impl Decision {
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
            Decision::Edit(_) => "edit",
        }
    }

    pub(super) fn resulting_status(&self) -> ApprovalStatus {
        match self {
            Decision::Approve | Decision::Edit(_) => ApprovalStatus::Approved,
            Decision::Reject => ApprovalStatus::Rejected,
        }
    }

    pub(super) fn edited_arguments(&self) -> Option<&Value> {
        match self {
            Decision::Edit(arguments) => Some(arguments),
            _ => None,
        }
    }
}

/// A decision as a person sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionRequest {
    pub decision: Decision,
    pub comment: Option<String>,
    /// The `arguments_sha256` of the call the person saw, when sent: the
    /// decision counts only for that exact call.
    pub seen_sha256: Option<String>,
    pub decided_by: Option<KeyId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approval {
    pub id: ApprovalId,
    pub action: String,
    /// The call approving makes; `None` for an `action`.
    pub call: Option<ProposedCall>,
    pub status: ApprovalStatus,
    pub requested_at: Timestamp,
    pub resolved_at: Option<Timestamp>,
    pub comment: Option<String>,
    /// When a pending approval expires; `None` for records from before
    /// approvals expired.
    pub expires_at: Option<Timestamp>,
    /// Whether `approval.expiring` was recorded for it.
    pub expiry_warned: bool,
    /// The key that decided it; `None` while pending, and for a cancel or
    /// an expiry.
    pub resolved_by: Option<KeyId>,
    /// The arguments a person approved in place of the proposed ones.
    pub edited_arguments: Option<Value>,
}

impl Approval {
    pub fn kind(&self) -> ApprovalKind {
        if self.call.is_some() { ApprovalKind::ToolCall } else { ApprovalKind::Action }
    }

    /// The digest of the proposed arguments a decision can be bound to.
    pub fn arguments_sha256(&self) -> Option<String> {
        self.call.as_ref().map(|call| sha256_hex(canonical_json(&call.arguments).as_bytes()))
    }

    /// The arguments the call is made with once approved: the edited ones
    /// when a person edited them.
    pub fn arguments_to_use(&self) -> Option<&Value> {
        self.edited_arguments.as_ref().or(self.call.as_ref().map(|call| &call.arguments))
    }
}

/// An approval with what the inbox shows of its run.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    pub approval: Approval,
    pub run_id: RunId,
    pub agent: String,
    pub run_status: RunStatus,
}

impl InboxEntry {
    /// The entry of `run`'s approval `approval_id` when it has `status` and
    /// comes after `after`: what both stores show for an index entry, read
    /// back from the run as it is now (an index may lag behind it).
    pub fn of(
        run: &Run,
        approval_id: ApprovalId,
        status: ApprovalStatus,
        after: Option<&InboxPosition>,
    ) -> Option<InboxEntry> {
        let approval = run.approvals.iter().find(|approval| approval.id == approval_id && approval.status == status)?;
        let entry =
            InboxEntry { approval: approval.clone(), run_id: run.id, agent: run.agent.clone(), run_status: run.status };
        after.is_none_or(|after| entry.position() < *after).then_some(entry)
    }

    pub fn position(&self) -> InboxPosition {
        InboxPosition { requested_at: self.approval.requested_at, run_id: self.run_id, approval_id: self.approval.id }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// JSON text with object keys sorted (by their UTF-8 bytes, which is code
/// point order) and no whitespace; strings and numbers as `serde_json`
/// writes them (non-ASCII characters as themselves, not escaped). Written
/// here rather than by `serde_json::to_string`, whose key order depends on
/// a feature another crate may turn on.
pub fn canonical_json(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(value, &mut text);
    text
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            let mut sorted: Vec<_> = fields.iter().collect();
            sorted.sort_unstable_by_key(|&(key, _)| key);
            out.push('{');
            for (index, (key, field)) in sorted.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(field, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let value: Value =
            serde_json::from_str(r#"{ "zeta": [ {"b": 1, "a": "é\n"} ], "alpha": null, "Mid": 2.5, "a": true }"#)
                .unwrap();
        assert_eq!(canonical_json(&value), r#"{"Mid":2.5,"a":true,"alpha":null,"zeta":[{"a":"é\n","b":1}]}"#);
    }

    #[test]
    fn the_digest_matches_one_computed_by_hand() {
        // printf '%s' '{"city":"Paris","days":3}' | sha256sum
        let approval_arguments: Value = serde_json::from_str(r#"{"days": 3, "city": "Paris"}"#).unwrap();
        assert_eq!(
            sha256_hex(canonical_json(&approval_arguments).as_bytes()),
            "3d2e15266c8f3cadfde0307ac8ab31fa7d6cbcb95b5fb16e7e1c48a961db5969"
        );
    }
}
