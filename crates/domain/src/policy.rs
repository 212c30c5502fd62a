//! Approval policies: an owner's rules that decide which tool calls need a
//! person. One document per owner, replaced whole; evaluated on the exact
//! arguments of each call; tried on past decisions before it is trusted.

use std::collections::{BTreeMap, HashSet};

use regex::{Regex, RegexBuilder};
use serde_json::{Value, json};

use super::{KeyId, Timestamp};

/// The most rules a document holds.
pub const MAX_RULES: usize = 200;
/// The largest document, as the JSON of its rules.
pub const MAX_POLICY_BYTES: usize = 64 * 1024;
/// The longest pattern (`matches`) or glob.
const MAX_PATTERN_BYTES: usize = 1024;
/// What one compiled pattern may take: patterns that would blow up are
/// refused, and matching stays linear in the text (the `regex` crate).
const MAX_REGEX_BYTES: usize = 64 * 1024;
/// The most `matches` conditions one document holds: with the size limit,
/// what a document's patterns may take in memory is bounded.
pub const MAX_MATCHES_CONDITIONS: usize = 50;
const MAX_REASON_CHARS: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
    Ask,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::Ask => "ask",
        }
    }

    pub fn parse(text: &str) -> Option<Effect> {
        [Effect::Allow, Effect::Deny, Effect::Ask].into_iter().find(|effect| effect.as_str() == text)
    }

    /// Among matching rules, deny wins over ask, ask over allow.
    fn rank(self) -> u8 {
        match self {
            Effect::Deny => 2,
            Effect::Ask => 1,
            Effect::Allow => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleMode {
    Enforce,
    /// Never decides; the approval records what the rule would have done.
    LogOnly,
}

impl RuleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleMode::Enforce => "enforce",
            RuleMode::LogOnly => "log_only",
        }
    }

    pub fn parse(text: &str) -> Option<RuleMode> {
        [RuleMode::Enforce, RuleMode::LogOnly].into_iter().find(|mode| mode.as_str() == text)
    }
}

/// A pattern as written and as compiled.
#[derive(Clone, Debug)]
pub struct Pattern {
    text: String,
    regex: Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Pattern {
    /// A glob: `*` any run of characters, `?` one, anything else itself.
    fn glob(text: &str) -> Result<Pattern, String> {
        if text.is_empty() || text.len() > MAX_PATTERN_BYTES {
            return Err(format!("must be a glob pattern of 1 to {MAX_PATTERN_BYTES} bytes"));
        }
        let mut expression = String::with_capacity(text.len() + 8);
        for character in text.chars() {
            match character {
                '*' => expression.push_str(".*"),
                '?' => expression.push('.'),
                other => expression.push_str(&regex::escape(other.encode_utf8(&mut [0; 4]))),
            }
        }
        Pattern::whole(text, &expression)
    }

    /// A regular expression that must match the whole string. It is
    /// checked on its own first, so that no text can close the group that
    /// anchors it (`a)|(b`).
    fn regex(text: &str) -> Result<Pattern, String> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(format!("must be a regular expression of at most {MAX_PATTERN_BYTES} bytes"));
        }
        compile(text)?;
        Pattern::whole(text, text)
    }

    fn whole(text: &str, expression: &str) -> Result<Pattern, String> {
        Ok(Pattern { text: text.to_owned(), regex: compile(&format!(r"\A(?:{expression})\z"))? })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

fn compile(expression: &str) -> Result<Regex, String> {
    RegexBuilder::new(expression).size_limit(MAX_REGEX_BYTES).dfa_size_limit(MAX_REGEX_BYTES).build().map_err(|error| {
        match error {
            regex::Error::CompiledTooBig(_) => "is too large a regular expression once compiled".to_owned(),
            _ => "is not a valid regular expression".to_owned(),
        }
    })
}

/// One condition on the call's arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    /// A JSON Pointer (RFC 6901) into the arguments.
    pub path: String,
    pub op: Op,
    /// The value as written (numbers keep their form).
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Eq(Value),
    Ne(Value),
    Lt(f64),
    Le(f64),
    Gt(f64),
    Ge(f64),
    In(Vec<Value>),
    NotIn(Vec<Value>),
    Prefix(String),
    Matches(Pattern),
    Exists(bool),
}

const OPS: [&str; 11] = ["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "prefix", "matches", "exists"];

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Eq(_) => "==",
            Op::Ne(_) => "!=",
            Op::Lt(_) => "<",
            Op::Le(_) => "<=",
            Op::Gt(_) => ">",
            Op::Ge(_) => ">=",
            Op::In(_) => "in",
            Op::NotIn(_) => "not_in",
            Op::Prefix(_) => "prefix",
            Op::Matches(_) => "matches",
            Op::Exists(_) => "exists",
        }
    }

    fn parse(name: &str, value: &Value) -> Result<Op, (&'static str, String)> {
        let number = || value.as_f64().ok_or(("value", format!("must be a number for `{name}`")));
        let array = || value.as_array().cloned().ok_or(("value", format!("must be an array for `{name}`")));
        let string = || value.as_str().ok_or(("value", format!("must be a string for `{name}`")));
        Ok(match name {
            "==" => Op::Eq(value.clone()),
            "!=" => Op::Ne(value.clone()),
            "<" => Op::Lt(number()?),
            "<=" => Op::Le(number()?),
            ">" => Op::Gt(number()?),
            ">=" => Op::Ge(number()?),
            "in" => Op::In(array()?),
            "not_in" => Op::NotIn(array()?),
            "prefix" => Op::Prefix(string()?.to_owned()),
            "matches" => Op::Matches(Pattern::regex(string()?).map_err(|problem| ("value", problem))?),
            "exists" => Op::Exists(value.as_bool().ok_or(("value", "must be true or false for `exists`".to_owned()))?),
            _ => return Err(("op", format!("must be one of {}", OPS.join(", ")))),
        })
    }
}

impl Condition {
    /// Whether the condition holds for these arguments. A path that does
    /// not exist makes every op false but `exists: false`, `!=` and
    /// `not_in`.
    pub fn holds(&self, arguments: &Value) -> bool {
        let Some(found) = arguments.pointer(&self.path) else {
            return matches!(self.op, Op::Exists(false) | Op::Ne(_) | Op::NotIn(_));
        };
        let number = |bound: f64, compare: fn(f64, f64) -> bool| found.as_f64().is_some_and(|n| compare(n, bound));
        match &self.op {
            Op::Eq(value) => same(found, value),
            Op::Ne(value) => !same(found, value),
            Op::Lt(bound) => number(*bound, |n, b| n < b),
            Op::Le(bound) => number(*bound, |n, b| n <= b),
            Op::Gt(bound) => number(*bound, |n, b| n > b),
            Op::Ge(bound) => number(*bound, |n, b| n >= b),
            Op::In(values) => values.iter().any(|value| same(found, value)),
            Op::NotIn(values) => !values.iter().any(|value| same(found, value)),
            Op::Prefix(prefix) => found.as_str().is_some_and(|text| text.starts_with(prefix.as_str())),
            Op::Matches(pattern) => found.as_str().is_some_and(|text| pattern.is_match(text)),
            Op::Exists(exists) => *exists,
        }
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
fn same(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => match (left.as_f64(), right.as_f64()) {
            (Some(left), Some(right)) => left == right,
            _ => left == right,
        },
        _ => left == right,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub id: String,
    pub agent: Pattern,
    pub tool: Pattern,
    pub effect: Effect,
    pub mode: RuleMode,
    pub reason: Option<String>,
    pub when: Vec<Condition>,
}

impl Rule {
    pub fn matches(&self, call: &GatedCall) -> bool {
        self.agent.is_match(call.agent)
            && self.tool.is_match(call.tool)
            && self.when.iter().all(|condition| condition.holds(call.arguments))
    }

    /// The rule as the API shows it, every field present.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "agent": self.agent.as_str(),
            "tool": self.tool.as_str(),
            "effect": self.effect.as_str(),
            "mode": self.mode.as_str(),
            "reason": self.reason,
            "when": self.when.iter().map(|condition| json!({
                "path": condition.path,
                "op": condition.op.name(),
                "value": condition.value,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Why a document was refused: the rule (by index) and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{param}` {message}")]
pub struct RuleError {
    pub index: Option<usize>,
    /// Where, e.g. `rules[1].when[0].op`.
    pub param: String,
    pub message: String,
}

fn refuse(index: Option<usize>, param: impl Into<String>, message: impl Into<String>) -> RuleError {
    RuleError { index, param: param.into(), message: message.into() }
}

/// The rules of a document as sent (`{"rules": [...]}`), checked whole.
pub fn parse_rules(body: &Value) -> Result<Vec<Rule>, RuleError> {
    let Some(object) = body.as_object() else {
        return Err(refuse(None, "body", "must be a JSON object with `rules`"));
    };
    if let Some(unknown) = object.keys().find(|key| *key != "rules") {
        return Err(refuse(None, unknown.as_str(), "is not a field of a policy document"));
    }
    let rules = rules_of(object.get("rules"))?;
    if serde_json::to_string(rules).map_or(0, |text| text.len()) > MAX_POLICY_BYTES {
        return Err(refuse(None, "rules", format!("must be at most {MAX_POLICY_BYTES} bytes as JSON")));
    }
    parse_list(rules)
}

fn parse_list(rules: &[Value]) -> Result<Vec<Rule>, RuleError> {
    let mut ids = HashSet::new();
    let mut patterns = 0;
    rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            let rule = parse_rule(index, rule)?;
            if !ids.insert(rule.id.clone()) {
                return Err(refuse(
                    Some(index),
                    format!("rules[{index}].id"),
                    format!("`{}` is used by an earlier rule", rule.id),
                ));
            }
            patterns += rule.when.iter().filter(|condition| matches!(condition.op, Op::Matches(_))).count();
            if patterns > MAX_MATCHES_CONDITIONS {
                return Err(refuse(
                    Some(index),
                    format!("rules[{index}].when"),
                    format!("brings the document past {MAX_MATCHES_CONDITIONS} `matches` conditions"),
                ));
            }
            Ok(rule)
        })
        .collect()
}

fn rules_of(rules: Option<&Value>) -> Result<&Vec<Value>, RuleError> {
    let rules = rules
        .ok_or_else(|| refuse(None, "rules", "is required: an array of rules (empty for none)"))?
        .as_array()
        .ok_or_else(|| refuse(None, "rules", "must be an array of rules"))?;
    if rules.len() > MAX_RULES {
        return Err(refuse(None, "rules", format!("must hold at most {MAX_RULES} rules")));
    }
    Ok(rules)
}

const RULE_FIELDS: [&str; 7] = ["id", "agent", "tool", "effect", "mode", "reason", "when"];
const CONDITION_FIELDS: [&str; 3] = ["path", "op", "value"];

fn parse_rule(index: usize, rule: &Value) -> Result<Rule, RuleError> {
    let at = |field: &str| format!("rules[{index}].{field}");
    let refused = |field: &str, message: String| refuse(Some(index), at(field), message);
    let Some(rule) = rule.as_object() else {
        return Err(refuse(Some(index), format!("rules[{index}]"), "must be an object"));
    };
    if let Some(unknown) = rule.keys().find(|key| !RULE_FIELDS.contains(&key.as_str())) {
        return Err(refused(unknown, "is not a field of a rule".into()));
    }
    // Only `reason` may be null; a field left out takes its default.
    let text = |field: &str| -> Result<Option<&str>, RuleError> {
        match rule.get(field) {
            None => Ok(None),
            Some(Value::Null) if field == "reason" => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(refused(field, "must be a string".into())),
        }
    };
    let id = text("id")?.ok_or_else(|| refused("id", "is required".into()))?;
    if !is_rule_id(id) {
        return Err(refused(
            "id",
            "must be 1 to 63 lower-case letters, digits, `_` or `-`, starting with a letter or digit".into(),
        ));
    }
    let glob = |field: &str| Pattern::glob(text(field)?.unwrap_or("*")).map_err(|problem| refused(field, problem));
    let effect = text("effect")?.ok_or_else(|| refused("effect", "is required: allow, deny or ask".into()))?;
    let effect = Effect::parse(effect).ok_or_else(|| refused("effect", "must be allow, deny or ask".into()))?;
    let mode = match text("mode")? {
        None => RuleMode::Enforce,
        Some(mode) => RuleMode::parse(mode).ok_or_else(|| refused("mode", "must be enforce or log_only".into()))?,
    };
    let reason = text("reason")?.map(str::to_owned);
    if reason.as_ref().is_some_and(|reason| reason.chars().count() > MAX_REASON_CHARS) {
        return Err(refused("reason", format!("must be at most {MAX_REASON_CHARS} characters")));
    }
    let when = match rule.get("when") {
        None => Vec::new(),
        Some(Value::Array(conditions)) => conditions
            .iter()
            .enumerate()
            .map(|(number, condition)| parse_condition(index, number, condition))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(refused("when", "must be an array of conditions".into())),
    };
    Ok(Rule { id: id.to_owned(), agent: glob("agent")?, tool: glob("tool")?, effect, mode, reason, when })
}

fn parse_condition(index: usize, number: usize, condition: &Value) -> Result<Condition, RuleError> {
    let at = |field: &str| format!("rules[{index}].when[{number}].{field}");
    let refused = |field: &str, message: String| refuse(Some(index), at(field), message);
    let Some(condition) = condition.as_object() else {
        return Err(refuse(Some(index), format!("rules[{index}].when[{number}]"), "must be an object"));
    };
    if let Some(unknown) = condition.keys().find(|key| !CONDITION_FIELDS.contains(&key.as_str())) {
        return Err(refused(unknown, "is not a field of a condition".into()));
    }
    let path = match condition.get("path") {
        Some(Value::String(path)) if path.is_empty() || path.starts_with('/') => path.clone(),
        Some(Value::String(_)) => {
            return Err(refused("path", "must be a JSON Pointer: empty, or starting with `/`".into()));
        }
        _ => return Err(refused("path", "is required: a JSON Pointer into the arguments".into())),
    };
    let op = condition
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| refused("op", format!("is required: one of {}", OPS.join(", "))))?;
    let value = condition.get("value").ok_or_else(|| refused("value", "is required".into()))?;
    let op = Op::parse(op, value).map_err(|(field, problem)| refused(field, problem))?;
    Ok(Condition { path, op, value: value.clone() })
}

/// `^[a-z0-9][a-z0-9_-]{0,62}$`, as the contract has it.
pub fn is_rule_id(id: &str) -> bool {
    let mut characters = id.chars();
    characters.next().is_some_and(|first| first.is_ascii_lowercase() || first.is_ascii_digit())
        && id.len() <= 63
        && characters.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// An owner's policy document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    /// 0 for an owner who never put one; one more with each put.
    pub version: u64,
    pub rules: Vec<Rule>,
    pub updated_at: Option<Timestamp>,
    pub updated_by: Option<KeyId>,
}

/// A tool call to decide.
#[derive(Clone, Copy, Debug)]
pub struct GatedCall<'a> {
    pub agent: &'a str,
    pub tool: &'a str,
    pub arguments: &'a Value,
    /// The tool's own `requires_approval`: what decides when no rule does.
    pub requires_approval: bool,
    /// The tool's `always_ask`: no rule allows it.
    pub always_ask: bool,
}

/// The rule an approval names: the one that decided (or would have).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyMatch {
    pub rule: String,
    pub effect: Effect,
    pub mode: RuleMode,
    /// The version of the document the rule was in.
    pub version: u64,
}

/// What happens to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It runs, with no approval (no rule made one needed, the tool needs none).
    Run,
    /// A person decides; the approval names `policy` (an `ask` rule, or a
    /// `log_only` rule's verdict), if any.
    Ask { policy: Option<PolicyMatch> },
    /// A rule allowed it where a person would have been asked: it runs, and
    /// an approval, already approved, records the rule.
    Allowed { policy: PolicyMatch },
    /// A rule denied it: it never runs; an approval, already rejected,
    /// records the rule, and the model is told `reason`.
    Denied { policy: PolicyMatch, reason: Option<String> },
}

impl Policy {
    /// The verdict on `call`: among the matching `enforce` rules deny wins
    /// over ask, ask over allow (the first in the document of that effect
    /// decides); with none, the tool's own `requires_approval`. A tool that
    /// always asks is never allowed by a rule: a matching allow acts as ask.
    pub fn evaluate(&self, call: &GatedCall) -> Verdict {
        let named = |rule: &Rule, effect: Effect| PolicyMatch {
            rule: rule.id.clone(),
            effect,
            mode: rule.mode,
            version: self.version,
        };
        let person_asked = call.requires_approval || call.always_ask;
        let deciding = self.rules.iter().filter(|rule| rule.mode == RuleMode::Enforce && rule.matches(call)).fold(
            None::<&Rule>,
            |best, rule| match best {
                Some(best) if best.effect.rank() >= rule.effect.rank() => Some(best),
                _ => Some(rule),
            },
        );
        match deciding {
            Some(rule) => match rule.effect {
                Effect::Deny => Verdict::Denied { policy: named(rule, Effect::Deny), reason: rule.reason.clone() },
                Effect::Ask => Verdict::Ask { policy: Some(named(rule, Effect::Ask)) },
                Effect::Allow if call.always_ask => Verdict::Ask { policy: Some(named(rule, Effect::Ask)) },
                Effect::Allow if person_asked => Verdict::Allowed { policy: named(rule, Effect::Allow) },
                Effect::Allow => Verdict::Run,
            },
            None if person_asked => Verdict::Ask {
                policy: self.rules.iter().find(|rule| rule.mode == RuleMode::LogOnly && rule.matches(call)).map(
                    |rule| {
                        // What it would have done: never allow a tool that always asks.
                        let effect =
                            if call.always_ask && rule.effect == Effect::Allow { Effect::Ask } else { rule.effect };
                        named(rule, effect)
                    },
                ),
            },
            None => Verdict::Run,
        }
    }

    /// The document as the API shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "version": self.version,
            "rules": self.rules.iter().map(Rule::to_json).collect::<Vec<_>>(),
            "updated_at": self.updated_at.map(Timestamp::to_rfc3339),
            "updated_by": self.updated_by.map(|key| key.to_string()),
        })
    }
}

/// How a person decided a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HumanDecision {
    Approved,
    Edited,
    Rejected,
}

impl HumanDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            HumanDecision::Approved => "approved",
            HumanDecision::Edited => "edited",
            HumanDecision::Rejected => "rejected",
        }
    }
}

/// A tool call a person decided, as the history keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct DecidedCall {
    pub run_id: super::RunId,
    pub approval_id: super::ApprovalId,
    pub agent: String,
    pub tool: String,
    /// As proposed.
    pub arguments: Value,
    pub human: HumanDecision,
    pub resolved_at: Timestamp,
}

impl DecidedCall {
    /// `approval` of the run `run_id` (of `agent`) as the history keeps
    /// it: only a tool call, and only once a person decided it.
    pub fn of(run_id: super::RunId, agent: &str, approval: &super::Approval) -> Option<DecidedCall> {
        let call = approval.call.as_ref()?;
        if !matches!(approval.resolved_by, Some(super::Resolver::Key(_))) {
            return None;
        }
        let human = match approval.status {
            super::ApprovalStatus::Rejected => HumanDecision::Rejected,
            super::ApprovalStatus::Approved if approval.edited_arguments.is_some() => HumanDecision::Edited,
            super::ApprovalStatus::Approved => HumanDecision::Approved,
            _ => return None,
        };
        Some(DecidedCall {
            run_id,
            approval_id: approval.id,
            agent: agent.to_owned(),
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            human,
            resolved_at: approval.resolved_at?,
        })
    }
}

/// The most disagreements a replay lists.
pub const MAX_DISAGREEMENTS: usize = 100;

/// What candidate rules would have done with past decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub evaluated: usize,
    pub would_allow: usize,
    pub would_deny: usize,
    pub would_ask: usize,
    /// Newest first, at most [`MAX_DISAGREEMENTS`].
    pub disagreements: Vec<(DecidedCall, PolicyMatch)>,
    /// Per rule id: matched, agreed, disagreed.
    pub rules: BTreeMap<String, RuleTally>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleTally {
    pub matched: usize,
    pub agreed: usize,
    pub disagreed: usize,
}

/// Replays `rules` over `history` (newest first), each call as the person
/// saw it (a call put to a person needed one). Only the deciding `enforce`
/// rule agrees or disagrees (a `log_only` rule never decides; an `ask`
/// neither agrees nor disagrees).
pub fn replay(rules: Vec<Rule>, history: &[DecidedCall]) -> Replay {
    let policy = Policy { rules, ..Policy::default() };
    let mut replay = Replay { evaluated: history.len(), ..Replay::default() };
    for rule in &policy.rules {
        replay.rules.insert(rule.id.clone(), RuleTally::default());
    }
    for decided in history {
        let call = GatedCall {
            agent: &decided.agent,
            tool: &decided.tool,
            arguments: &decided.arguments,
            requires_approval: true,
            always_ask: false,
        };
        for rule in policy.rules.iter().filter(|rule| rule.matches(&call)) {
            if let Some(tally) = replay.rules.get_mut(&rule.id) {
                tally.matched += 1;
            }
        }
        let named = match policy.evaluate(&call) {
            Verdict::Allowed { policy } => {
                replay.would_allow += 1;
                Some(policy)
            }
            Verdict::Denied { policy, .. } => {
                replay.would_deny += 1;
                Some(policy)
            }
            Verdict::Ask { policy } => {
                replay.would_ask += 1;
                policy.filter(|policy| policy.mode == RuleMode::Enforce)
            }
            Verdict::Run => None,
        };
        let Some(named) = named else { continue };
        let agrees = match (named.effect, decided.human) {
            (Effect::Ask, _) => continue,
            (Effect::Allow, HumanDecision::Rejected)
            | (Effect::Deny, HumanDecision::Approved | HumanDecision::Edited) => false,
            _ => true,
        };
        if let Some(tally) = replay.rules.get_mut(&named.rule) {
            if agrees {
                tally.agreed += 1;
            } else {
                tally.disagreed += 1;
            }
        }
        if !agrees && replay.disagreements.len() < MAX_DISAGREEMENTS {
            replay.disagreements.push((decided.clone(), named));
        }
    }
    replay
}

/// The rules' JSON as stored: the array the API shows.
pub fn rules_json(rules: &[Rule]) -> Value {
    Value::Array(rules.iter().map(Rule::to_json).collect())
}

/// Rules read back from [`rules_json`] (which fills in every default, so
/// may be longer than the document as sent: no size limit here).
pub fn rules_from_json(rules: &Value) -> Result<Vec<Rule>, RuleError> {
    parse_list(rules.as_array().ok_or_else(|| refuse(None, "rules", "must be an array of rules"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(rules: Value) -> Vec<Rule> {
        parse_rules(&json!({ "rules": rules })).unwrap()
    }

    fn refused(rules: Value) -> RuleError {
        parse_rules(&json!({ "rules": rules })).unwrap_err()
    }

    fn call<'a>(tool: &'a str, arguments: &'a Value) -> GatedCall<'a> {
        GatedCall { agent: "janitor", tool, arguments, requires_approval: true, always_ask: false }
    }

    fn policy(rules_json: Value) -> Policy {
        Policy { version: 4, rules: rules(rules_json), ..Policy::default() }
    }

    #[test]
    fn rules_read_back_with_every_default_filled_in() {
        let read = rules(json!([{"id": "a", "effect": "allow"}]));
        assert_eq!(
            rules_json(&read),
            json!([{"id": "a", "agent": "*", "tool": "*", "effect": "allow", "mode": "enforce", "reason": null, "when": []}])
        );
        let full = json!([{"id": "small-deletes", "agent": "jan?tor", "tool": "delete_*", "effect": "deny",
            "mode": "log_only", "reason": "no", "when": [{"path": "/count", "op": "<=", "value": 3.0}]}]);
        assert_eq!(rules_from_json(&rules_json(&rules(full.clone()))).unwrap(), rules(full));
    }

    #[test]
    fn malformed_rules_name_the_rule_and_the_field() {
        let cases = [
            (json!([{"id": "a", "effect": "allow"}, {"id": "b", "effect": "maybe"}]), Some(1), "rules[1].effect"),
            (json!([{"id": "a", "effect": "allow", "colour": 1}]), Some(0), "rules[0].colour"),
            (json!([{"id": "a", "effect": "allow"}, {"id": "a", "effect": "deny"}]), Some(1), "rules[1].id"),
            (json!([{"id": "a b", "effect": "allow"}]), Some(0), "rules[0].id"),
            (json!([{"id": "Upper", "effect": "allow"}]), Some(0), "rules[0].id"),
            (json!([{"id": "-lead", "effect": "allow"}]), Some(0), "rules[0].id"),
            (json!([{"id": "x".repeat(64), "effect": "allow"}]), Some(0), "rules[0].id"),
            (json!([{"effect": "allow"}]), Some(0), "rules[0].id"),
            (json!([{"id": "a", "effect": "allow", "mode": "dry"}]), Some(0), "rules[0].mode"),
            (json!([{"id": "a", "effect": "allow", "tool": ""}]), Some(0), "rules[0].tool"),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "~", "value": 1}]}]),
                Some(0),
                "rules[0].when[0].op",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "<", "value": "1"}]}]),
                Some(0),
                "rules[0].when[0].value",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "in", "value": 1}]}]),
                Some(0),
                "rules[0].when[0].value",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "matches", "value": "("}]}]),
                Some(0),
                "rules[0].when[0].value",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "exists", "value": "yes"}]}]),
                Some(0),
                "rules[0].when[0].value",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "n", "op": "==", "value": 1}]}]),
                Some(0),
                "rules[0].when[0].path",
            ),
            (
                json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "==", "value": 1, "x": 2}]}]),
                Some(0),
                "rules[0].when[0].x",
            ),
            (json!([{"id": "a", "effect": "allow", "when": {}}]), Some(0), "rules[0].when"),
            (json!([{"id": "a", "effect": "allow", "when": null}]), Some(0), "rules[0].when"),
            (json!([{"id": "a", "effect": "allow", "tool": null}]), Some(0), "rules[0].tool"),
            (json!({}), None, "rules"),
        ];
        for (rules, index, param) in cases {
            let error = refused(rules.clone());
            assert_eq!((error.index, error.param.as_str()), (index, param), "{rules}: {error}");
        }
        let many: Vec<Value> = (0..=MAX_RULES).map(|n| json!({"id": format!("r{n}"), "effect": "ask"})).collect();
        assert_eq!(refused(Value::Array(many)).param, "rules");
        let long = json!([{"id": "a", "effect": "ask", "reason": "x".repeat(400)}]);
        let big: Vec<Value> =
            (0..180).map(|n| json!({"id": format!("r{n}"), "effect": "ask", "reason": "x".repeat(400)})).collect();
        assert!(parse_rules(&json!({"rules": long})).is_ok());
        assert_eq!(refused(Value::Array(big)).param, "rules", "over 64 KiB");
        assert_eq!(parse_rules(&json!({"rules": [], "extra": 1})).unwrap_err().param, "extra");
        assert_eq!(parse_rules(&json!([])).unwrap_err().param, "body");
    }

    /// A pattern whose compiled form would blow up is refused, not run.
    #[test]
    fn patterns_that_blow_up_are_refused() {
        let huge = json!([{"id": "a", "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "(a{1,1000}){1,1000}"}]}]);
        assert!(refused(huge).message.contains("too large"));
        // No text closes the anchoring group: refused, not a looser pattern.
        let escaping =
            json!([{"id": "a", "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "a)|(b"}]}]);
        assert_eq!(refused(escaping).param, "rules[0].when[0].value");
        let anchored =
            rules(json!([{"id": "a", "effect": "deny", "when": [{"path": "/s", "op": "matches", "value": "a|b"}]}]));
        assert!(
            anchored[0].matches(&call("t", &json!({"s": "b"})))
                && !anchored[0].matches(&call("t", &json!({"s": "ab"})))
        );
        // A document's patterns are bounded in number.
        let many: Vec<Value> = (0..=MAX_MATCHES_CONDITIONS)
            .map(|n| json!({"id": format!("m{n}"), "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "x"}]}))
            .collect();
        assert_eq!(refused(Value::Array(many)).index, Some(MAX_MATCHES_CONDITIONS));
        // Backtracking-prone in other engines, linear here.
        let rules =
            rules(json!([{"id": "a", "effect": "deny", "when": [{"path": "/s", "op": "matches", "value": "(a+)+$"}]}]));
        let arguments = json!({"s": format!("{}!", "a".repeat(30_000))});
        assert!(!rules[0].matches(&call("t", &arguments)));
    }

    #[test]
    fn conditions_read_the_exact_arguments() {
        let arguments = json!({"count": 3, "branch": "feature/x", "env": "prod", "tags": ["a"], "a/b": {"~c": 1.0}});
        let holds = |op: &str, path: &str, value: Value| {
            let rule =
                rules(json!([{"id": "r", "effect": "allow", "when": [{"path": path, "op": op, "value": value}]}]));
            rule[0].matches(&call("t", &arguments))
        };
        assert!(holds("<=", "/count", json!(3)) && !holds("<", "/count", json!(3)) && holds(">", "/count", json!(2.5)));
        assert!(holds(">=", "/count", json!(3.0)) && !holds(">=", "/branch", json!(0)), "numbers only");
        assert!(holds("==", "/count", json!(3.0)) && holds("!=", "/env", json!("staging")));
        assert!(holds("==", "/a~1b/~0c", json!(1)), "RFC 6901 escapes");
        assert!(holds("in", "/env", json!(["prod", "dev"])) && holds("not_in", "/env", json!(["dev"])));
        assert!(holds("prefix", "/branch", json!("feature/")) && !holds("prefix", "/count", json!("3")));
        assert!(holds("matches", "/branch", json!("feature/.*")) && !holds("matches", "/branch", json!("feature")));
        assert!(holds("==", "/tags", json!(["a"])));
        // A path that does not exist: only exists false, != and not_in hold.
        assert!(holds("exists", "/missing", json!(false)) && !holds("exists", "/missing", json!(true)));
        assert!(holds("!=", "/missing", json!(1)) && holds("not_in", "/missing", json!([1])));
        for op in ["==", "<", "<=", ">", ">=", "prefix", "matches"] {
            let value = if op == "prefix" || op == "matches" { json!("x") } else { json!(1) };
            assert!(!holds(op, "/missing", value), "{op}");
        }
        assert!(!holds("in", "/missing", json!([null])));
    }

    #[test]
    fn deny_wins_over_ask_and_ask_over_allow_then_the_tool_decides() {
        let arguments = json!({"count": 2});
        let policy = policy(json!([
            {"id": "allow-all", "tool": "*", "effect": "allow"},
            {"id": "ask-deletes", "tool": "delete_*", "effect": "ask"},
            {"id": "deny-big", "tool": "delete_*", "effect": "deny", "reason": "too many", "when": [{"path": "/count", "op": ">", "value": 1}]},
            {"id": "watch", "tool": "read_*", "effect": "deny", "mode": "log_only"},
        ]));
        let named = |rule: &str, effect| PolicyMatch { rule: rule.into(), effect, mode: RuleMode::Enforce, version: 4 };
        assert_eq!(
            policy.evaluate(&call("delete_branch", &arguments)),
            Verdict::Denied { policy: named("deny-big", Effect::Deny), reason: Some("too many".into()) }
        );
        let one = json!({"count": 1});
        assert_eq!(
            policy.evaluate(&call("delete_branch", &one)),
            Verdict::Ask { policy: Some(named("ask-deletes", Effect::Ask)) }
        );
        assert_eq!(
            policy.evaluate(&call("create_branch", &one)),
            Verdict::Allowed { policy: named("allow-all", Effect::Allow) }
        );
        // Allowed where no one would have been asked: no approval.
        let ungated = GatedCall { requires_approval: false, ..call("create_branch", &one) };
        assert_eq!(policy.evaluate(&ungated), Verdict::Run);
        // A tool that always asks is never allowed by a rule.
        let always = GatedCall { always_ask: true, ..call("create_branch", &one) };
        assert_eq!(policy.evaluate(&always), Verdict::Ask { policy: Some(named("allow-all", Effect::Ask)) });
        // No enforce rule: the tool decides; a log_only rule is named.
        let logged = policy_of(json!([{"id": "watch", "effect": "deny", "mode": "log_only"}]));
        let watched = PolicyMatch { rule: "watch".into(), effect: Effect::Deny, mode: RuleMode::LogOnly, version: 4 };
        assert_eq!(logged.evaluate(&call("read_file", &one)), Verdict::Ask { policy: Some(watched) });
        assert_eq!(logged.evaluate(&GatedCall { requires_approval: false, ..call("read_file", &one) }), Verdict::Run);
        assert_eq!(Policy::default().evaluate(&call("x", &one)), Verdict::Ask { policy: None });
        let other_agent = GatedCall { agent: "builder", ..call("delete_branch", &arguments) };
        let scoped = policy_of(json!([{"id": "j", "agent": "jan*", "effect": "deny"}]));
        assert_eq!(scoped.evaluate(&other_agent), Verdict::Ask { policy: None });
    }

    fn policy_of(rules_json: Value) -> Policy {
        policy(rules_json)
    }

    #[test]
    fn a_replay_counts_what_rules_would_have_done_and_lists_disagreements() {
        let decided = |n: u128, tool: &str, count: i64, human| DecidedCall {
            run_id: super::super::RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
            approval_id: super::super::ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
            agent: "janitor".into(),
            tool: tool.into(),
            arguments: json!({ "count": count }),
            human,
            resolved_at: Timestamp::from_millis(1_795_303_478_123),
        };
        let history = [
            decided(1, "delete_branch", 2, HumanDecision::Approved),
            decided(2, "delete_branch", 3, HumanDecision::Rejected),
            decided(3, "delete_branch", 9, HumanDecision::Edited),
            decided(4, "deploy", 1, HumanDecision::Approved),
            decided(5, "read_file", 1, HumanDecision::Rejected),
        ];
        let replay = replay(
            rules(json!([
                {"id": "small-deletes", "tool": "delete_*", "effect": "allow", "when": [{"path": "/count", "op": "<=", "value": 3}]},
                {"id": "big-deletes", "tool": "delete_*", "effect": "deny", "when": [{"path": "/count", "op": ">", "value": 3}]},
                {"id": "reads", "tool": "read_*", "effect": "allow", "mode": "log_only"},
                {"id": "ask-deploys", "tool": "deploy", "effect": "ask"},
            ])),
            &history,
        );
        assert_eq!((replay.evaluated, replay.would_allow, replay.would_deny, replay.would_ask), (5, 2, 1, 2));
        let disagreeing: Vec<(u128, &str)> = replay
            .disagreements
            .iter()
            .map(|(call, policy)| (call.run_id.ulid().random(), policy.rule.as_str()))
            .collect();
        // The log_only rule decides nothing, so agrees and disagrees with no one.
        assert_eq!(disagreeing, [(2, "small-deletes"), (3, "big-deletes")]);
        let tally = |rule: &str| replay.rules[rule];
        assert_eq!(tally("small-deletes"), RuleTally { matched: 2, agreed: 1, disagreed: 1 });
        assert_eq!(tally("big-deletes"), RuleTally { matched: 1, agreed: 0, disagreed: 1 });
        assert_eq!(tally("reads"), RuleTally { matched: 1, agreed: 0, disagreed: 0 });
        assert_eq!(tally("ask-deploys"), RuleTally { matched: 1, agreed: 0, disagreed: 0 });
    }
}
