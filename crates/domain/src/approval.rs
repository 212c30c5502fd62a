//! Approvals: what a run asks a human, the exact call it would make, and
//! the decision that binds to it.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ids::{ApprovalId, KeyId, MalformedId};
use crate::policy::PolicyMatch;
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Canceled,
    Expired,
    /// A question a person answered.
    Answered,
}

impl ApprovalStatus {
    pub const ALL: [ApprovalStatus; 6] = [
        ApprovalStatus::Pending,
        ApprovalStatus::Approved,
        ApprovalStatus::Rejected,
        ApprovalStatus::Canceled,
        ApprovalStatus::Expired,
        ApprovalStatus::Answered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Canceled => "canceled",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Answered => "answered",
        }
    }

    pub fn parse(text: &str) -> Option<ApprovalStatus> {
        ApprovalStatus::ALL.into_iter().find(|status| status.as_str() == text)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApprovalKind {
    /// A line of the script agent: words only.
    Action,
    /// A call of a defined agent's tool, with its arguments.
    ToolCall,
    /// A question a person answers (`ask`, a defined agent's `ask_human`).
    Input,
}

impl ApprovalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Action => "action",
            ApprovalKind::ToolCall => "tool_call",
            ApprovalKind::Input => "input",
        }
    }

    pub const ALL: [ApprovalKind; 3] = [ApprovalKind::Action, ApprovalKind::ToolCall, ApprovalKind::Input];

    pub fn parse(text: &str) -> Option<ApprovalKind> {
        ApprovalKind::ALL.into_iter().find(|kind| kind.as_str() == text)
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

/// The bytes of arguments (proposed and edited), questions' schemas and
/// answers these approvals hold.
pub fn approval_arguments_bytes(approvals: &[Approval]) -> usize {
    approvals
        .iter()
        .flat_map(|approval| {
            let proposed = approval.call.as_ref().map(|call| &call.arguments);
            [proposed, approval.edited_arguments.as_ref(), approval.input_schema.as_ref(), approval.answer.as_ref()]
        })
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

/// What an agent asks a human to decide, or what a rule decided in a
/// person's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// In plain words, what approving will do.
    pub action: String,
    /// The exact call, when approving makes one.
    pub call: Option<ProposedCall>,
    /// The rule the approval names (see [`Approval::policy`]).
    pub policy: Option<PolicyMatch>,
    /// Set when that rule decided the call: the approval is recorded
    /// already resolved, and no one is asked.
    pub decided: Option<RuleDecision>,
    /// For a question: the JSON Schema its answer must satisfy.
    pub input_schema: Option<Value>,
    /// The call's tool is new or changed since its MCP server was pinned.
    pub tool_changed: bool,
    /// A veto window: approved by `timeout` this long after it is asked
    /// unless a person decides first.
    pub auto_approve_after: Option<std::time::Duration>,
}

/// What a rule decided in a person's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleDecision {
    Allowed,
    /// Never made; the model is told `reason`.
    Denied {
        reason: Option<String>,
    },
}

impl ApprovalRequest {
    /// The veto window the approval gets: none when a rule decided the call
    /// already, or when an `enforce` rule said a person must (`ask`), which
    /// nobody's silence may stand in for.
    pub fn veto_window(&self) -> Option<std::time::Duration> {
        let person_must = self.policy.as_ref().is_some_and(PolicyMatch::person_must_decide);
        self.auto_approve_after.filter(|_| self.decided.is_none() && !person_must)
    }

    pub fn action(action: impl Into<String>) -> Self {
        ApprovalRequest {
            action: action.into(),
            call: None,
            policy: None,
            decided: None,
            input_schema: None,
            tool_changed: false,
            auto_approve_after: None,
        }
    }

    /// A person is asked `question`, to be answered as `schema` says. No
    /// rule decides it.
    pub fn question(question: impl Into<String>, schema: Value) -> Self {
        ApprovalRequest { input_schema: Some(schema), ..ApprovalRequest::action(question) }
    }

    /// A person is asked about `call`.
    pub fn call(action: impl Into<String>, call: ProposedCall) -> Self {
        ApprovalRequest { call: Some(call), ..ApprovalRequest::action(action) }
    }
}

/// Who resolved an approval: a person's API key, or a policy's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolver {
    Key(KeyId),
    /// The id of the rule.
    Policy(String),
    /// Nobody objected within the tool's veto window.
    Timeout,
}

impl Resolver {
    pub fn key(&self) -> Option<KeyId> {
        match self {
            Resolver::Key(key) => Some(*key),
            Resolver::Policy(_) | Resolver::Timeout => None,
        }
    }
}

/// `key_<ulid>`, `policy:<rule id>` or `timeout`.
impl std::fmt::Display for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolver::Key(key) => key.fmt(f),
            Resolver::Policy(rule) => write!(f, "policy:{rule}"),
            Resolver::Timeout => f.write_str("timeout"),
        }
    }
}

impl std::str::FromStr for Resolver {
    type Err = MalformedId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "timeout" {
            return Ok(Resolver::Timeout);
        }
        match text.strip_prefix("policy:") {
            // Whatever id a rule had when it decided (ids are checked when put).
            Some(rule) if !rule.is_empty() => Ok(Resolver::Policy(rule.to_owned())),
            _ => text.parse().map(Resolver::Key),
        }
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
    /// Answer a question (an `input` approval) with this.
    Answer(Value),
}

impl Decision {
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
            Decision::Edit(_) => "edit",
            Decision::Answer(_) => "answer",
        }
    }

    pub(super) fn resulting_status(&self) -> ApprovalStatus {
        match self {
            Decision::Approve | Decision::Edit(_) => ApprovalStatus::Approved,
            Decision::Reject => ApprovalStatus::Rejected,
            Decision::Answer(_) => ApprovalStatus::Answered,
        }
    }

    pub fn answer(&self) -> Option<&Value> {
        match self {
            Decision::Answer(answer) => Some(answer),
            _ => None,
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
    /// The key (or the policy's rule) that decided it; `None` while
    /// pending, and for a cancel or an expiry.
    pub resolved_by: Option<Resolver>,
    /// The arguments a person approved in place of the proposed ones.
    pub edited_arguments: Option<Value>,
    /// The policy's rule that decided it, or would have (`log_only`).
    pub policy: Option<PolicyMatch>,
    /// For a question (`input`): the JSON Schema its answer must satisfy.
    pub input_schema: Option<Value>,
    /// A question's answer, once a person gave it.
    pub answer: Option<Value>,
    /// The call's tool (of an MCP server) is new or changed since the
    /// server was pinned; a person decides it whatever rules say.
    pub tool_changed: bool,
    /// When a still-pending approval is approved by `timeout` (its tool's
    /// veto window); `None` without one.
    pub auto_approves_at: Option<Timestamp>,
}

impl Approval {
    pub fn kind(&self) -> ApprovalKind {
        match (&self.call, &self.input_schema) {
            (Some(_), _) => ApprovalKind::ToolCall,
            (None, Some(_)) => ApprovalKind::Input,
            (None, None) => ApprovalKind::Action,
        }
    }

    /// The digest of the proposed arguments a decision can be bound to.
    pub fn arguments_sha256(&self) -> Option<String> {
        self.call.as_ref().map(|call| sha256_hex(canonical_json(&call.arguments).as_bytes()))
    }

    /// How it was decided, as its `approval.decided` event and its receipt
    /// name it; `None` while pending and for a cancel or an expiry.
    pub fn decision(&self) -> Option<&'static str> {
        match self.status {
            ApprovalStatus::Approved if matches!(self.resolved_by, Some(Resolver::Timeout)) => Some("timeout"),
            ApprovalStatus::Approved if self.edited_arguments.is_some() => Some("edit"),
            ApprovalStatus::Approved => Some("approve"),
            ApprovalStatus::Rejected => Some("reject"),
            ApprovalStatus::Answered => Some("answer"),
            ApprovalStatus::Pending | ApprovalStatus::Canceled | ApprovalStatus::Expired => None,
        }
    }

    /// The arguments the call is made with once approved: the edited ones
    /// when a person edited them.
    pub fn arguments_to_use(&self) -> Option<&Value> {
        self.edited_arguments.as_ref().or(self.call.as_ref().map(|call| &call.arguments))
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The JSON text of `value` per RFC 8785, the JSON Canonicalization Scheme:
/// object keys sorted by their UTF-16 code units, no whitespace, numbers as
/// ECMAScript writes the IEEE 754 double they stand for, strings with only
/// the escapes JSON requires. Approval digests cover this text, and a tool
/// receives it, so any client can compute the digest with a JCS library.
pub fn canonical_json(value: &Value) -> String {
    serde_json_canonicalizer::to_string(value).expect("a JSON value always has a canonical form")
}

/// The largest integer every JSON reader holds exactly (2^53 - 1: I-JSON,
/// RFC 7493); JavaScript, and RFC 8785, read numbers as doubles.
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

/// Refuses a whole number beyond +/-(2^53 - 1) anywhere in `value`, as an
/// integer or written with an exponent: a reader of doubles (a browser, JCS)
/// may see another number than the one written (a literal past 2^64 is read
/// as a double here too, so the two cannot be told apart), and what a person
/// is shown, what the digest covers and what the tool receives could differ.
/// Says which one and what to do instead.
pub fn check_exact_numbers(value: &Value) -> Result<(), String> {
    match value {
        Value::Number(number) => {
            let exact = match (number.as_u64(), number.as_i64(), number.as_f64()) {
                (Some(unsigned), _, _) => unsigned <= MAX_EXACT_INTEGER,
                (None, Some(signed), _) => signed.unsigned_abs() <= MAX_EXACT_INTEGER,
                (None, None, Some(float)) => float.fract() != 0.0 || float.abs() <= MAX_EXACT_INTEGER as f64,
                (None, None, None) => true,
            };
            if exact {
                Ok(())
            } else {
                Err(format!(
                    "The number {number} is a whole number beyond what every JSON reader holds exactly (+/-{MAX_EXACT_INTEGER}, I-JSON); send it as a string."
                ))
            }
        }
        Value::Array(items) => items.iter().try_for_each(check_exact_numbers),
        Value::Object(fields) => fields.values().try_for_each(check_exact_numbers),
        _ => Ok(()),
    }
}

/// `value` as it reads back from its canonical text (`2.0` as `2`), checked
/// with [`check_exact_numbers`]: what is kept, compared and sent from then on.
pub fn exact_canonical(value: &Value) -> Result<Value, String> {
    check_exact_numbers(value)?;
    Ok(serde_json::from_str(&canonical_json(value)).expect("canonical JSON reads back"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8785's own examples (section 3.2.2 and appendix B) and the cases
    /// a plain `sort_keys` serializer gets wrong.
    #[test]
    fn canonical_json_is_rfc_8785() {
        for (json, canonical) in [
            (
                r#"{"b": 1, "a": [1.5, -0, 0.0, 1e-7, 1e21, 1e+22, 100, 1E2]}"#,
                r#"{"a":[1.5,0,0,1e-7,1e+21,1e+22,100,100],"b":1}"#,
            ),
            (
                r#"[333333333.33333329, 5e-324, 0.000001, 9007199254740991]"#,
                "[333333333.3333333,5e-324,0.000001,9007199254740991]",
            ),
            (
                r#"{"\u20ac": "\u2028 \u00e9 \ud83d\ude00 \u0001\n\"\\/"}"#,
                "{\"\u{20ac}\":\"\u{2028} \u{e9} \u{1f600} \\u0001\\n\\\"\\\\/\"}",
            ),
            // By UTF-16 code units, an astral character (a surrogate pair,
            // 0xD83D...) sorts before U+E000; by code points it would not.
            (
                "{\"\u{e000}\": 1, \"\u{1f600}\": 2, \"a\": {\"z\": 1, \"Z\": 2}}",
                "{\"a\":{\"Z\":2,\"z\":1},\"\u{1f600}\":2,\"\u{e000}\":1}",
            ),
        ] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(canonical_json(&value), canonical, "{json}");
        }
    }

    #[test]
    fn integers_beyond_2_to_the_53_are_refused_anywhere_in_the_arguments() {
        for fine in [r#"{"a": 9007199254740991}"#, r#"{"a": -9007199254740991}"#, r#"{"a": [1.5e-300, 0.5, 9e15]}"#] {
            assert_eq!(check_exact_numbers(&serde_json::from_str(fine).unwrap()), Ok(()), "{fine}");
        }
        for beyond in [
            r#"{"account": 12345678901234567891}"#,
            r#"{"a": [{"b": 9007199254740992}]}"#,
            r#"{"a": -9007199254740992}"#,
        ] {
            let problem = check_exact_numbers(&serde_json::from_str(beyond).unwrap()).unwrap_err();
            assert!(problem.contains("string"), "{problem}");
        }
        let normalised = exact_canonical(&serde_json::from_str(r#"{"b": 2.0, "a": -0.0, "c": 5e-7}"#).unwrap());
        assert_eq!(normalised.unwrap().to_string(), r#"{"a":0,"b":2,"c":5e-7}"#);
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
